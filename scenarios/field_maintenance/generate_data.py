"""Generate the simulated fleet's telemetry and event log (run once; the output is committed).

    python -m scenarios.field_maintenance.generate_data

Telemetry: one sample per hour for a week (168 hours from START) per device and metric:
baseline + daily cycle + seeded Gaussian noise, plus the injected faults listed in FAULTS
(drifts, steps, spikes). FAN-01 stops reporting at OFFLINE_FAN_HOUR (communication lost).
The faults are also written to data/faults.json: ground truth for tests and docs, not read
by any tool. Events are routine entries plus the alarms the faults would raise.
"""

from __future__ import annotations

import csv
import json
import math
import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

DATA_DIR = Path(__file__).parent / "data"
START = datetime(2024, 6, 1, tzinfo=UTC)
HOURS = 168
BASELINE_HOURS = 48
OFFLINE_FAN_HOUR = 156


@dataclass(frozen=True)
class Signal:
    """A metric's normal behaviour: level, daily swing (amplitude), noise sigma."""

    unit: str
    level: float
    daily: float
    noise: float
    warn: float | None = None  # operating limits shown by device_status
    alarm: float | None = None
    low_is_bad: bool = False


@dataclass(frozen=True)
class Fault:
    device: str
    metric: str
    kind: str  # drift | step | spike
    start: int
    end: int  # last affected hour (inclusive)
    size: float  # drift: change per hour; step/spike: offset
    cause: str


PUMP = {
    "vibration_mm_s": Signal("mm/s", 2.1, 0.1, 0.15, warn=4.5, alarm=7.1),
    "bearing_temp_c": Signal("°C", 52.0, 1.5, 0.8, warn=70.0, alarm=80.0),
    "flow_m3h": Signal("m³/h", 120.0, 6.0, 2.5),
    "discharge_pressure_bar": Signal("bar", 6.2, 0.15, 0.08, warn=7.5, alarm=8.0),
}
DEVICE_TYPES = {
    "centrifugal_pump": PUMP,
    "air_compressor": {
        "discharge_pressure_bar": Signal("bar", 8.0, 0.1, 0.1, warn=9.0, alarm=9.5),
        "motor_current_a": Signal("A", 42.0, 2.0, 0.8, warn=55.0, alarm=60.0),
        "oil_temp_c": Signal("°C", 68.0, 2.0, 0.9, warn=85.0, alarm=95.0),
    },
    "transformer": {
        "oil_temp_c": Signal("°C", 61.0, 3.0, 0.7, warn=85.0, alarm=95.0),
        "load_pct": Signal("%", 64.0, 12.0, 3.0, warn=90.0, alarm=100.0),
        "dissolved_h2_ppm": Signal("ppm", 35.0, 0.0, 1.5, warn=100.0, alarm=150.0),
    },
    "standby_generator": {
        "battery_v": Signal("V", 24.6, 0.05, 0.05, warn=24.0, alarm=23.0, low_is_bad=True),
        "coolant_temp_c": Signal("°C", 38.0, 1.0, 0.4, warn=45.0, alarm=50.0),
        "fuel_level_pct": Signal("%", 92.0, 0.0, 0.3, warn=40.0, alarm=20.0, low_is_bad=True),
    },
    "cooling_fan": {
        "speed_rpm": Signal("rpm", 1450.0, 40.0, 12.0),
        "motor_temp_c": Signal("°C", 47.0, 2.0, 0.6, warn=75.0, alarm=85.0),
    },
}

DEVICES = [
    {"id": "PUMP-01", "type": "centrifugal_pump", "model": "Hydra CP-200", "site": "North Well Field",
     "firmware": "3.4.2", "installed": "2019-04-11", "last_service": "2024-03-18"},
    {"id": "PUMP-02", "type": "centrifugal_pump", "model": "Hydra CP-200", "site": "South Well Field",
     "firmware": "3.4.2", "installed": "2018-09-02", "last_service": "2023-08-30"},
    {"id": "COMP-01", "type": "air_compressor", "model": "Aerix SC-75", "site": "North Well Field",
     "firmware": "1.9.0", "installed": "2020-06-21", "last_service": "2024-01-09"},
    {"id": "TX-01", "type": "transformer", "model": "Voltrane 2.5 MVA", "site": "Main Substation",
     "firmware": "5.1.1", "installed": "2016-11-30", "last_service": "2023-11-14"},
    {"id": "GEN-01", "type": "standby_generator", "model": "Dunmore DG-500", "site": "Main Substation",
     "firmware": "2.2.7", "installed": "2017-05-05", "last_service": "2024-02-26"},
    {"id": "FAN-01", "type": "cooling_fan", "model": "Breeze AX-900", "site": "Main Substation",
     "firmware": "1.0.4", "installed": "2021-02-17", "last_service": "2024-04-02"},
]

FAULTS = [
    Fault("PUMP-02", "bearing_temp_c", "drift", 110, HOURS - 1, 0.35,
          "bearing wear: lubrication breakdown heats the drive-end bearing"),
    Fault("PUMP-02", "vibration_mm_s", "drift", 118, HOURS - 1, 0.06,
          "bearing wear: rising vibration follows the bearing temperature"),
    Fault("COMP-01", "discharge_pressure_bar", "spike", 73, 74, 1.6,
          "pressure relief valve chatter (sticking valve seat)"),
    Fault("COMP-01", "discharge_pressure_bar", "spike", 140, 140, 1.8,
          "pressure relief valve chatter (sticking valve seat)"),
    Fault("TX-01", "dissolved_h2_ppm", "step", 96, HOURS - 1, 14.0,
          "partial discharge in the winding insulation releases hydrogen"),
    Fault("GEN-01", "battery_v", "drift", 150, HOURS - 1, -0.08,
          "failing starter battery cell: voltage sags under the charger's float"),
]

# Alarms the faults raise (hour, device, level, code, message) and routine entries.
FAULT_EVENTS = [
    (73, "COMP-01", "error", "E305", "Pressure relief valve opened at 9.7 bar"),
    (75, "COMP-01", "info", "I010", "Discharge pressure back to normal"),
    (101, "TX-01", "warning", "W120", "Dissolved gas monitor: hydrogen rising above baseline"),
    (127, "PUMP-02", "warning", "W210", "Bearing temperature above trend band"),
    (140, "COMP-01", "error", "E305", "Pressure relief valve opened at 9.8 bar"),
    (141, "COMP-01", "info", "I010", "Discharge pressure back to normal"),
    (146, "PUMP-02", "warning", "W211", "Vibration above trend band"),
    (156, "FAN-01", "error", "E900", "Communication lost with field controller"),
    (154, "PUMP-02", "error", "A211", "Vibration above 4.5 mm/s warning limit"),
    (157, "GEN-01", "warning", "W410", "Starter battery voltage below 24.0 V"),
    (158, "PUMP-02", "error", "A210", "Bearing temperature above 70 C warning limit"),
]
STATUS = {"PUMP-01": "ok", "PUMP-02": "alarm", "COMP-01": "ok", "TX-01": "warning",
          "GEN-01": "warning", "FAN-01": "offline"}


def iso(hour: int) -> str:
    return (START + timedelta(hours=hour)).strftime("%Y-%m-%dT%H:%MZ")


def fault_offset(fault: Fault, hour: int) -> float:
    if not fault.start <= hour <= fault.end:
        return 0.0
    if fault.kind == "drift":
        return fault.size * (hour - fault.start + 1)
    return fault.size  # step and spike hold a constant offset over their hours


def series(device: dict, metric: str, signal: Signal, rng: random.Random) -> list[float]:
    last_hour = OFFLINE_FAN_HOUR if device["id"] == "FAN-01" else HOURS
    faults = [f for f in FAULTS if f.device == device["id"] and f.metric == metric]
    values = []
    for hour in range(last_hour):
        # Daily cycle peaks mid-afternoon (15:00).
        value = signal.level + signal.daily * math.cos(2 * math.pi * (hour - 15) / 24)
        value += rng.gauss(0.0, signal.noise)
        value += sum(fault_offset(f, hour) for f in faults)
        values.append(round(value, 2))
    return values


def routine_events() -> list[tuple]:
    events = []
    for day in range(7):
        for device in DEVICES:
            if device["id"] == "FAN-01" and day * 24 + 6 >= OFFLINE_FAN_HOUR:
                continue
            events.append((day * 24 + 6, device["id"], "info", "I001", "Daily self-test passed"))
    events.append((30, "PUMP-01", "info", "I020", "Operator round: no findings"))
    events.append((52, "GEN-01", "info", "I030", "Weekly no-load test run, 15 min"))
    events.append((88, "COMP-01", "info", "I020", "Operator round: relief valve hissing noted"))
    events.append((120, "TX-01", "info", "I040", "Oil sample taken for laboratory DGA"))
    return events


def build() -> tuple[dict, dict, list[dict], list[dict]]:
    """Return (telemetry by device and metric, fleet metadata, events, faults); deterministic."""
    rng = random.Random(20240601)
    telemetry = {
        device["id"]: {metric: series(device, metric, signal, rng)
                       for metric, signal in DEVICE_TYPES[device["type"]].items()}
        for device in DEVICES
    }
    fleet = {
        "start": iso(0),
        "hours": HOURS,
        "baseline_hours": BASELINE_HOURS,
        "metrics": {
            device_type: {m: {k: v for k, v in vars(s).items() if k not in ("level", "daily", "noise")}
                          for m, s in signals.items()}
            for device_type, signals in DEVICE_TYPES.items()
        },
        "devices": [{**d, "status": STATUS[d["id"]]} for d in DEVICES],
    }
    events = [{"time": iso(h), "device": d, "level": lvl, "code": c, "message": m}
              for h, d, lvl, c, m in sorted(FAULT_EVENTS + routine_events(), key=lambda e: (e[0], e[1]))]
    faults = [{**vars(f), "from": iso(f.start), "to": iso(f.end)} for f in FAULTS]
    return telemetry, fleet, events, faults


def main() -> None:
    telemetry, fleet, events, faults = build()
    telemetry_dir = DATA_DIR / "telemetry"
    telemetry_dir.mkdir(parents=True, exist_ok=True)
    for device_id, columns in telemetry.items():
        with open(telemetry_dir / f"{device_id}.csv", "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["hour", *columns])
            for hour, row in enumerate(zip(*columns.values())):
                writer.writerow([hour, *row])
    (DATA_DIR / "fleet.json").write_text(json.dumps(fleet, indent=1, ensure_ascii=False) + "\n")
    (DATA_DIR / "events.json").write_text(json.dumps(events, indent=1) + "\n")
    (DATA_DIR / "faults.json").write_text(json.dumps(faults, indent=1) + "\n")
    print(f"wrote {len(telemetry)} devices, {len(events)} events, {len(faults)} faults to {DATA_DIR}")


if __name__ == "__main__":
    main()
