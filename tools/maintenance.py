"""Tools of the field_maintenance scenario: fleet status, telemetry trends, logs, manual.

Data comes from the simulated fleet, which the scenario hands in
(`maintenance_tools(load_fleet)`: tools never import scenarios). Times are UTC ISO strings;
the data covers one week, hour by hour. Trend statistics use the anomaly detector of
tools/anomaly.py (robust z-scores against the first days of the week). Unknown devices or
metrics raise `ToolError` naming what exists.

The fleet is duck-typed: ``start``, ``hours``, ``baseline_hours``, ``devices``,
``telemetry``, ``events``, ``manual`` (sections with ``title`` and ``text``),
``device(id)``, ``metrics(id)``, ``series(id, metric)`` and ``time(hour)`` (lookups raise
`LookupError` naming what exists).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from datetime import datetime
from typing import Any

from tools.anomaly import detect, slope
from tools.base import Tool, ToolContext, ToolError, object_schema, with_data
from tools.text_search import rank

LEVELS = ("info", "warning", "error")
_MAX_EPISODES = 10


def _device(fleet: Any, device_id: str) -> dict:
    try:
        return fleet.device(device_id)
    except LookupError as problem:
        raise ToolError(str(problem.args[0])) from None


def _event_hour(fleet: Any, event: dict) -> int:
    moment = datetime.strptime(event["time"], "%Y-%m-%dT%H:%MZ")
    return int((moment - fleet.start).total_seconds() // 3600)


def _week_alarms(fleet: Any, device_id: str) -> list[str]:
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


def device_status(fleet: Any, ctx: ToolContext, device_id: str | None = None) -> dict:
    if device_id is None:
        return {
            "as_of": fleet.time(fleet.hours - 1),
            "devices": [{"id": d["id"], "type": d["type"], "site": d["site"], "status": d["status"],
                         "week_alarms": _week_alarms(fleet, d["id"])} for d in fleet.devices],
        }
    device = _device(fleet, device_id)
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


def _trend(fleet: Any, device_id: str, metric: str, hours: int, z_threshold: float) -> dict:
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


def trend_statistics(fleet: Any, ctx: ToolContext, device_id: str, metric: str | None = None,
                     hours: int = 168, z_threshold: float = 4.0) -> dict:
    device = _device(fleet, device_id)
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


def query_logs(fleet: Any, ctx: ToolContext, device_id: str | None = None, level: str | None = None,
               code: str | None = None, contains: str | None = None, last_hours: int | None = None,
               limit: int = 10) -> dict:
    events = list(fleet.events)
    if device_id is not None:
        wanted = _device(fleet, device_id)["id"]
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


def search_manual(fleet: Any, ctx: ToolContext, query: str, limit: int = 2) -> dict:
    hits = rank(query, fleet.manual, lambda s: f"{s.title} {s.text}", limit)
    return {"query": query, "sections": [{"title": s.title, "text": s.text} for _, s in hits]}


def maintenance_tools(source: Callable[[], Any]) -> tuple[Tool, ...]:
    """The tools, reading the fleet that ``source()`` returns (see the module docstring)."""
    bind = with_data(source)
    # The device ids are listed in the schema: a small model picks from an enum far more
    # reliably than it invents an id (unconstrained, it may write digits until max_tokens).
    device = {"type": "string", "enum": [d["id"] for d in source().devices]}
    return (
        Tool("device_status", "Fleet overview, or one device's status and latest readings.",
             object_schema({"device_id": device}), bind(device_status)),
        Tool("trend_statistics", "Telemetry statistics and anomalies of a device (one or all metrics).",
             object_schema({"device_id": device, "metric": {"type": "string"},
                            "hours": {"type": "integer", "minimum": 6, "maximum": 168},
                            "z_threshold": {"type": "number", "minimum": 2, "maximum": 10}},
                           ["device_id"]),
             bind(trend_statistics)),
        Tool("query_logs", "Event log entries, newest first; filters are optional.",
             object_schema({"device_id": device,
                            "level": {"type": "string", "enum": list(LEVELS), "description": "minimum level"},
                            "code": {"type": "string"}, "contains": {"type": "string"},
                            "last_hours": {"type": "integer", "minimum": 1, "maximum": 168},
                            "limit": {"type": "integer", "minimum": 1, "maximum": 50}}),
             bind(query_logs)),
        Tool("search_manual", "Search the service manual by keywords or fault code.",
             object_schema({"query": {"type": "string"},
                            "limit": {"type": "integer", "minimum": 1, "maximum": 5}},
                           ["query"]),
             bind(search_manual)),
    )
