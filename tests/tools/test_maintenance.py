"""field_maintenance data, anomaly detection and tools."""

import json
import random

import pytest

from scenarios.field_maintenance import generate_data
from scenarios.field_maintenance.fleet import DATA_DIR, load_fleet
from tools.anomaly import detect
from tools.base import ToolContext, ToolError, run_tool
from tools.maintenance import maintenance_tools

CTX = ToolContext()
TOOLS = {t.name: t for t in maintenance_tools(load_fleet)}
FLEET = load_fleet()
FAULTS = json.loads((DATA_DIR / "faults.json").read_text())


async def call(name, **arguments):
    return await run_tool(TOOLS[name], CTX, arguments)


def test_fleet_shape():
    assert len(FLEET.devices) == 6
    for device in FLEET.devices:
        telemetry = FLEET.telemetry[device["id"]]
        assert set(telemetry) == set(FLEET.metrics(device["id"]))
        lengths = {len(v) for v in telemetry.values()}
        expected = generate_data.OFFLINE_FAN_HOUR if device["id"] == "FAN-01" else FLEET.hours
        assert lengths == {expected}
    assert len(FLEET.manual) >= 10


def test_committed_files_match_the_generator():
    telemetry, fleet, events, faults = generate_data.build()
    assert telemetry == FLEET.telemetry
    assert json.loads((DATA_DIR / "fleet.json").read_text(encoding="utf-8")) == fleet
    assert list(FLEET.events) == events
    assert FAULTS == faults


def test_detector_finds_every_injected_fault_and_nothing_else():
    faults = {(f["device"], f["metric"]) for f in FAULTS}
    for device_id, metrics in FLEET.telemetry.items():
        for metric, values in metrics.items():
            _, episodes = detect(values, baseline=FLEET.baseline_hours)
            injected = [f for f in FAULTS if (f["device"], f["metric"]) == (device_id, metric)]
            if (device_id, metric) not in faults:
                assert episodes == [], f"false alarm on {device_id} {metric}"
                continue
            for fault in injected:
                hits = [e for e in episodes if e.start <= fault["end"] and e.end >= fault["start"]]
                assert hits, f"missed {fault}"
                expected_kind = "spike" if fault["kind"] == "spike" else "shift"
                assert {e.kind for e in hits} == {expected_kind}
                assert hits[0].direction == ("down" if fault["size"] < 0 else "up")
            # every episode belongs to an injected fault
            for episode in episodes:
                assert any(episode.start <= f["end"] and episode.end >= f["start"] for f in injected)


def test_detector_on_synthetic_series():
    rng = random.Random(1)
    values = [10 + rng.gauss(0, 0.5) for _ in range(100)]
    values[70] += 8
    for i in range(85, 100):
        values[i] += 5
    _, episodes = detect(values, baseline=40)
    assert [(e.kind, e.start) for e in episodes] == [("spike", 70), ("shift", 85)]


async def test_device_status_overview_and_detail():
    overview = await call("device_status")
    assert {d["id"]: d["status"] for d in overview["devices"]}["PUMP-02"] == "alarm"
    detail = await call("device_status", device_id="PUMP-02")
    assert detail["id"] == "PUMP-02"
    assert detail["latest"]["bearing_temp_c"]["state"] == "warning"
    assert "A210" in detail["week_alarms"]
    fan = await call("device_status", device_id="FAN-01")
    assert fan["status"] == "offline" and fan["last_sample"] == FLEET.time(generate_data.OFFLINE_FAN_HOUR - 1)


async def test_trend_statistics_reports_the_injected_faults():
    temp = await call("trend_statistics", device_id="PUMP-02", metric="bearing_temp_c")
    assert temp["slope_per_hour"] > 0
    assert [a["kind"] for a in temp["anomalies"]] == ["shift up"]
    assert temp["anomalies"][0]["to"] == FLEET.time(FLEET.hours - 1)

    pressure = await call("trend_statistics", device_id="COMP-01", metric="discharge_pressure_bar")
    assert [a["from"] for a in pressure["anomalies"]] == [FLEET.time(73), FLEET.time(140)]
    assert all(a["kind"] == "spike up" for a in pressure["anomalies"])

    recent = await call("trend_statistics", device_id="COMP-01", metric="discharge_pressure_bar", hours=30)
    assert recent["samples"] == 30 and [a["from"] for a in recent["anomalies"]] == [FLEET.time(140)]

    device = await call("trend_statistics", device_id="GEN-01")
    by_metric = {m["metric"]: m for m in device["metrics"]}
    assert [a["kind"] for a in by_metric["battery_v"]["anomalies"]] == ["shift down"]
    assert by_metric["coolant_temp_c"]["anomalies"] == []


async def test_query_logs_filters():
    errors = await call("query_logs", level="error")
    assert errors["events"] and all(e["level"] == "error" for e in errors["events"])
    times = [e["time"] for e in errors["events"]]
    assert times == sorted(times, reverse=True)
    pump = await call("query_logs", device_id="PUMP-02", level="warning", limit=50)
    assert {e["code"] for e in pump["events"]} == {"W210", "W211", "A210", "A211"}
    coded = await call("query_logs", code="e305")
    assert coded["total"] == 2 and all(e["device"] == "COMP-01" for e in coded["events"])
    recent = await call("query_logs", last_hours=12, contains="battery")
    assert [e["code"] for e in recent["events"]] == ["W410"]
    assert (await call("query_logs", limit=3))["total"] == len(FLEET.events)


async def test_search_manual():
    result = await call("search_manual", query="relief valve spikes compressor")
    assert result["sections"][0]["title"].startswith("E305")
    assert len((await call("search_manual", query="W410 battery", limit=1))["sections"]) == 1


@pytest.mark.parametrize("name, arguments, message", [
    ("device_status", {"device_id": "PUMP-99"}, "'device_id' must be one of PUMP-01, PUMP-02"),
    ("trend_statistics", {"device_id": "PUMP-01", "metric": "rpm"},
     "PUMP-01 has no metric 'rpm'; it has: vibration_mm_s"),
    ("trend_statistics", {"device_id": "PUMP-01", "hours": 2}, "'hours' must be at least 6"),
    ("query_logs", {"level": "panic"}, "'level' must be one of info, warning, error"),
])
async def test_bad_input_is_a_readable_tool_error(name, arguments, message):
    with pytest.raises(ToolError) as caught:
        await call(name, **arguments)
    assert message in str(caught.value)
