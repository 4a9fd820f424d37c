"""Read-only access to the simulated fleet shipped in data/ (found via Path(__file__).parent).

`load_fleet()` reads the device list, hourly telemetry (one CSV per device), the event log
and the service manual (split into sections at its `## ` headings) once. Unknown devices or
metrics raise `LookupError` naming what exists; the tools turn it into a `ToolError`.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from pathlib import Path

DATA_DIR = Path(__file__).parent / "data"


@dataclass(frozen=True)
class ManualSection:
    title: str
    text: str


@dataclass(frozen=True)
class Fleet:
    start: datetime
    hours: int
    baseline_hours: int
    devices: tuple[dict, ...]
    metric_specs: dict  # device type -> metric -> {unit, warn, alarm, low_is_bad}
    telemetry: dict  # device id -> metric -> list of hourly values from `start`
    events: tuple[dict, ...]
    manual: tuple[ManualSection, ...]

    def device(self, device_id: str) -> dict:
        wanted = device_id.strip().upper()
        for device in self.devices:
            if device["id"] == wanted:
                return device
        known = ", ".join(d["id"] for d in self.devices)
        raise LookupError(f"unknown device {device_id!r}; known: {known}")

    def metrics(self, device_id: str) -> dict:
        return self.metric_specs[self.device(device_id)["type"]]

    def series(self, device_id: str, metric: str) -> list[float]:
        device = self.device(device_id)
        values = self.telemetry[device["id"]]
        if metric not in values:
            raise LookupError(f"{device['id']} has no metric {metric!r}; it has: {', '.join(values)}")
        return values[metric]

    def time(self, hour: int) -> str:
        return (self.start + timedelta(hours=hour)).strftime("%Y-%m-%dT%H:%MZ")


def _read_telemetry(path: Path) -> dict[str, list[float]]:
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    metrics = [name for name in rows[0] if name != "hour"]
    return {m: [float(row[m]) for row in rows] for m in metrics}


def _read_manual(path: Path) -> tuple[ManualSection, ...]:
    sections: list[ManualSection] = []
    title: str | None = None
    lines: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            if title:
                sections.append(ManualSection(title, "\n".join(lines).strip()))
            title, lines = line[3:].strip(), []
        elif title:
            lines.append(line)
    if title:
        sections.append(ManualSection(title, "\n".join(lines).strip()))
    return tuple(sections)


@cache
def load_fleet() -> Fleet:
    meta = json.loads((DATA_DIR / "fleet.json").read_text(encoding="utf-8"))
    devices = tuple(meta["devices"])
    return Fleet(
        start=datetime.strptime(meta["start"], "%Y-%m-%dT%H:%MZ"),
        hours=meta["hours"],
        baseline_hours=meta["baseline_hours"],
        devices=devices,
        metric_specs=meta["metrics"],
        telemetry={d["id"]: _read_telemetry(DATA_DIR / "telemetry" / f"{d['id']}.csv") for d in devices},
        events=tuple(json.loads((DATA_DIR / "events.json").read_text(encoding="utf-8"))),
        manual=_read_manual(DATA_DIR / "manual.md"),
    )
