"""Tools of the field_maintenance scenario: fleet status, telemetry trends, logs, manual.

Data comes from the simulated fleet (scenarios/field_maintenance/data). Times are UTC ISO
strings; the data covers one week, hour by hour. Trend statistics use the anomaly detector
of tools/anomaly.py (robust z-scores against the first days of the week). Unknown devices
or metrics raise `ToolError` naming what exists.
"""

from __future__ import annotations

import json
import statistics
from datetime import datetime
from pathlib import Path

from scenarios.field_maintenance.fleet import Fleet, load_fleet
from tools.anomaly import detect, slope
from tools.base import Tool, ToolContext, ToolError, object_schema
from tools.text_search import rank

LEVELS = ("info", "warning", "error")
_MAX_EPISODES = 10


def _device_ids() -> list[str]:
    """The fleet's device ids, listed in the schema: a small model picks from an enum far more
    reliably than it invents an id (unconstrained, it may write digits until max_tokens)."""
    fleet = json.loads((Path(__file__).resolve().parents[1] / "scenarios" / "field_maintenance" / "data"
                        / "fleet.json").read_text())
    return [d["id"] for d in fleet["devices"]]


_DEVICE = {"type": "string", "enum": _device_ids()}


def _fleet() -> Fleet:
    return load_fleet()


def _device(device_id: str) -> dict:
    try:
        return _fleet().device(device_id)
    except LookupError as problem:
        raise ToolError(str(problem.args[0])) from None


def _event_hour(fleet: Fleet, event: dict) -> int:
    moment = datetime.strptime(event["time"], "%Y-%m-%dT%H:%MZ")
    return int((moment - fleet.start).total_seconds() // 3600)


def _week_alarms(fleet: Fleet, device_id: str) -> list[str]:
    """Distinct warning/error codes the device logged this week, oldest first."""
    codes = [e["code"] for e in fleet.events if e["device"] == device_id and e["level"] != "info"]
    return list(dict.fromkeys(codes))


def _limit_state(value: float, spec: dict) -> str:
    def beyond(limit: float | None) -> bool:
        if limit is None:
            return False
        return value < limit if spec.get("low_is_bad") else value > limit

    if beyond(spec.get("alarm")):
        return "alarm"
    if beyond(spec.get("warn")):
        return "warning"
    return "ok"


def device_status(ctx: ToolContext, device_id: str | None = None) -> dict:
    fleet = _fleet()
    if device_id is None:
        return {
            "as_of": fleet.time(fleet.hours - 1),
            "devices": [{"id": d["id"], "type": d["type"], "site": d["site"], "status": d["status"],
                         "week_alarms": _week_alarms(fleet, d["id"])} for d in fleet.devices],
        }
    device = _device(device_id)
    telemetry = fleet.telemetry[device["id"]]
    samples = len(next(iter(telemetry.values())))
    latest = {}
    for metric, spec in fleet.metrics(device["id"]).items():
        value = telemetry[metric][-1]
        reading = {"value": value, "unit": spec["unit"], "state": _limit_state(value, spec)}
        reading.update({k: spec[k] for k in ("warn", "alarm") if spec.get(k) is not None})
        latest[metric] = reading
    return {**device, "last_sample": fleet.time(samples - 1),
            "week_alarms": _week_alarms(fleet, device["id"]), "latest": latest}


def _trend(fleet: Fleet, device_id: str, metric: str, hours: int, z_threshold: float) -> dict:
    values = fleet.series(device_id, metric)
    _, episodes = detect(values, baseline=fleet.baseline_hours, threshold=z_threshold)
    first = max(0, len(values) - hours)
    window = values[first:]
    in_window = [e for e in episodes if e.end >= first]
    return {
        "metric": metric,
        "unit": fleet.metrics(device_id)[metric]["unit"],
        "from": fleet.time(first), "to": fleet.time(len(values) - 1), "samples": len(window),
        "mean": round(statistics.fmean(window), 2),
        "std": round(statistics.pstdev(window), 2),
        "min": min(window), "max": max(window), "last": window[-1],
        "slope_per_hour": round(slope(window), 4),
        "anomalies": [
            {"from": fleet.time(e.start), "to": fleet.time(e.end), "kind": f"{e.kind} {e.direction}",
             "points": e.points, "peak": e.peak_value, "peak_z": e.peak_z}
            for e in in_window[:_MAX_EPISODES]
        ],
    }


def trend_statistics(ctx: ToolContext, device_id: str, metric: str | None = None,
                     hours: int = 168, z_threshold: float = 4.0) -> dict:
    fleet = _fleet()
    device = _device(device_id)
    baseline = {"baseline": f"first {fleet.baseline_hours} h, robust z > {z_threshold}"}
    try:
        if metric is not None:
            return {"device": device["id"], **baseline,
                    **_trend(fleet, device["id"], metric, hours, z_threshold)}
        trends = [_trend(fleet, device["id"], m, hours, z_threshold) for m in fleet.metrics(device["id"])]
    except LookupError as problem:
        raise ToolError(str(problem.args[0])) from None
    # Without a metric: one compact line per metric, so the whole device fits in few tokens.
    return {"device": device["id"], **baseline, "metrics": [
        {key: t[key] for key in ("metric", "unit", "mean", "last", "slope_per_hour", "anomalies")}
        for t in trends
    ]}


def query_logs(ctx: ToolContext, device_id: str | None = None, level: str | None = None,
               code: str | None = None, contains: str | None = None, last_hours: int | None = None,
               limit: int = 10) -> dict:
    fleet = _fleet()
    events = list(fleet.events)
    if device_id is not None:
        wanted = _device(device_id)["id"]
        events = [e for e in events if e["device"] == wanted]
    if level is not None:
        events = [e for e in events if LEVELS.index(e["level"]) >= LEVELS.index(level)]
    if code is not None:
        events = [e for e in events if e["code"].upper() == code.strip().upper()]
    if contains is not None:
        events = [e for e in events if contains.lower() in e["message"].lower()]
    if last_hours is not None:
        since = fleet.hours - last_hours
        events = [e for e in events if _event_hour(fleet, e) >= since]
    newest_first = events[::-1]
    return {"total": len(events), "events": newest_first[:limit]}


def search_manual(ctx: ToolContext, query: str, limit: int = 2) -> dict:
    hits = rank(query, _fleet().manual, lambda s: f"{s.title} {s.text}", limit)
    return {"query": query, "sections": [{"title": s.title, "text": s.text} for _, s in hits]}


MAINTENANCE_TOOLS: tuple[Tool, ...] = (
    Tool("device_status", "Fleet overview, or one device's status and latest readings.",
         object_schema({"device_id": _DEVICE}), device_status),
    Tool("trend_statistics", "Telemetry statistics and anomalies of a device (one or all metrics).",
         object_schema({"device_id": _DEVICE, "metric": {"type": "string"},
                        "hours": {"type": "integer", "minimum": 6, "maximum": 168},
                        "z_threshold": {"type": "number", "minimum": 2, "maximum": 10}},
                       ["device_id"]),
         trend_statistics),
    Tool("query_logs", "Event log entries, newest first; filters are optional.",
         object_schema({"device_id": _DEVICE,
                        "level": {"type": "string", "enum": list(LEVELS), "description": "minimum level"},
                        "code": {"type": "string"}, "contains": {"type": "string"},
                        "last_hours": {"type": "integer", "minimum": 1, "maximum": 168},
                        "limit": {"type": "integer", "minimum": 1, "maximum": 50}}),
         query_logs),
    Tool("search_manual", "Search the service manual by keywords or fault code.",
         object_schema({"query": {"type": "string"},
                        "limit": {"type": "integer", "minimum": 1, "maximum": 5}},
                       ["query"]),
         search_manual),
)
