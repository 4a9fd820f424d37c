"""The simulated edge event service's world in each state: status, metrics, logs, dependencies.

Everything is a pure function of the state and a fixed clock (NOW), so an incident looks the
same on every run and in every replay:

- healthy: release 2.4.1 running for three days, every dependency fine.
- degraded: release 2.5.0 went out at 11:15; its new per-event dedup keys (flag dedup_v2)
  flood Redis, Redis slows down, the ingest queue backs up and latency and errors rise.
- failed: the same release also leaks PostgreSQL connections; the database refuses new
  clients, workers crash-loop and most requests fail.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Literal

State = Literal["healthy", "degraded", "failed"]
STATES: tuple[State, ...] = ("healthy", "degraded", "failed")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
NOW = datetime(2024, 6, 1, 12, 0, tzinfo=UTC)
SERVICE = "edge-event-api"
DEPLOY_MINUTES_AGO = 45


def _at(minutes_ago: float) -> str:
    return (NOW - timedelta(minutes=minutes_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def health(state: State) -> dict:
    return {"service": SERVICE, "status": {"healthy": "ok", "degraded": "degraded", "failed": "failed"}[state]}


def status(state: State) -> dict:
    release: dict[str, Any]
    runtime: dict[str, Any]
    if state == "healthy":
        release = {"version": "2.4.1", "previous_version": "2.4.0", "deployed_at": _at(3 * 24 * 60)}
        runtime = {"instances": "3/3 running", "restarts_1h": 0, "uptime_s": 3 * 24 * 3600}
    else:
        release = {"version": "2.5.0", "previous_version": "2.4.1", "deployed_at": _at(DEPLOY_MINUTES_AGO),
                   "feature_flags": ["dedup_v2"]}
        runtime = ({"instances": "3/3 running", "restarts_1h": 0, "uptime_s": DEPLOY_MINUTES_AGO * 60}
                   if state == "degraded" else
                   {"instances": "1/3 running (2 crash-looping)", "restarts_1h": 6, "uptime_s": 240})
    return {"service": SERVICE, "state": health(state)["status"], "now": _at(0), **release, **runtime}


_CURRENT: dict[str, dict[str, Any]] = {
    "healthy": {"requests_per_s": 220, "error_rate_pct": 0.2, "p95_latency_ms": 48, "queue_depth": 12,
                "consumer_lag_s": 0.4, "cpu_pct": 35, "memory_pct": 52, "db_pool_in_use": "8/50",
                "redis_hit_ratio": 0.94},
    "degraded": {"requests_per_s": 205, "error_rate_pct": 4.8, "p95_latency_ms": 880, "queue_depth": 4200,
                 "consumer_lag_s": 95, "cpu_pct": 88, "memory_pct": 79, "db_pool_in_use": "31/50",
                 "redis_hit_ratio": 0.38},
    "failed": {"requests_per_s": 61, "error_rate_pct": 62.0, "p95_latency_ms": 5000, "queue_depth": 48000,
               "consumer_lag_s": 1800, "cpu_pct": 23, "memory_pct": 91, "db_pool_in_use": "50/50",
               "redis_hit_ratio": 0.35},
}


def metrics(state: State) -> dict:
    """Current 5-minute values plus the last hour in 10-minute steps (oldest first)."""
    now = _CURRENT[state]
    calm = _CURRENT["healthy"]
    steps = [60, 50, 40, 30, 20, 10, 0]
    # Before the 11:15 deploy every state looked healthy; afterwards it ramps to `now`.
    def ramp(key: str) -> list[float]:
        if state == "healthy":
            return [calm[key]] * len(steps)
        values = []
        for minutes_ago in steps:
            if minutes_ago > DEPLOY_MINUTES_AGO:
                values.append(calm[key])
            else:
                share = (DEPLOY_MINUTES_AGO - minutes_ago) / DEPLOY_MINUTES_AGO
                values.append(round(calm[key] + (now[key] - calm[key]) * share, 1))
        return values

    return {
        "service": SERVICE, "window": "5m", "current": now,
        "last_hour": {"times": [_at(m)[11:16] for m in steps],
                      **{k: ramp(k) for k in ("error_rate_pct", "p95_latency_ms", "queue_depth")}},
    }


def dependencies(state: State) -> dict:
    deps = [
        {"name": "postgres", "kind": "database", "status": "ok", "latency_ms": 4, "detail": "primary, 8 connections"},
        {"name": "redis", "kind": "cache", "status": "ok", "latency_ms": 1, "detail": "memory 41%"},
        {"name": "mqtt-broker", "kind": "message broker", "status": "ok", "latency_ms": 3, "detail": "12 topics"},
        {"name": "object-store", "kind": "storage", "status": "ok", "latency_ms": 22, "detail": "bucket events-raw"},
    ]
    if state in ("degraded", "failed"):
        deps[1].update(status="degraded", latency_ms=240,
                       detail="memory 98% (maxmemory), evicting keys; 1.9M keys dedup:*")
    if state == "failed":
        deps[0].update(status="down", latency_ms=None,
                       detail="FATAL: sorry, too many clients already (max_connections 100)")
    return {"service": SERVICE, "dependencies": deps}


_BASE_LOGS = [
    (170, "info", "ingest", "consumer group edge-ingest rebalanced, 12 partitions"),
    (120, "info", "api", "health check ok"),
    (90, "debug", "scheduler", "compaction job finished in 2.1 s"),
    (60, "info", "api", "health check ok"),
]
_DEPLOY_LOGS = [
    (45, "info", "deploy", "release 2.5.0 rolled out to 3/3 instances (previous 2.4.1)"),
    (44, "info", "ingest", "feature flag dedup_v2 enabled: writing one dedup key per event"),
    (38, "warning", "redis", "slow response 180 ms on SETEX dedup:*"),
    (31, "warning", "redis", "used_memory at 92% of maxmemory"),
    (27, "warning", "ingest", "queue depth 1500 above 1000 threshold"),
    (22, "error", "redis", "OOM command not allowed when used memory > 'maxmemory'"),
    (18, "warning", "redis", "evicted 120000 keys in 60 s (allkeys-lru)"),
    (12, "error", "api", "request timeout after 2000 ms on POST /v1/events"),
    (9, "warning", "ingest", "queue depth 4000 above 1000 threshold, consumer lag 90 s"),
]
_DEGRADED_LOGS = [
    (5, "error", "api", "error rate 4.8% above 1% SLO"),
]
_FAILED_LOGS = [
    (30, "warning", "db", "connection pool in use 40/50, connections not returned by dedup_v2 writer"),
    (20, "error", "db", "could not obtain connection: pool exhausted (50/50)"),
    (16, "critical", "db", "postgres: FATAL: sorry, too many clients already"),
    (14, "critical", "worker", "worker exited with code 1: unhandled PoolTimeout, restarting (1/6)"),
    (8, "critical", "worker", "worker exited with code 1: unhandled PoolTimeout, restarting (6/6), back-off 5 min"),
    (6, "error", "api", "503 Service Unavailable returned for 62% of requests"),
    (4, "critical", "ingest", "queue depth 48000, messages older than 30 min dropped"),
]


def logs(state: State) -> list[dict]:
    """All log records of the state, oldest first."""
    entries = list(_BASE_LOGS)
    if state == "healthy":
        entries += [(30, "info", "api", "health check ok"), (1, "info", "api", "health check ok")]
    else:
        entries += _DEPLOY_LOGS
    entries += _DEGRADED_LOGS if state == "degraded" else _FAILED_LOGS if state == "failed" else []
    entries.sort(key=lambda e: -e[0])
    return [{"time": _at(m), "level": lvl, "component": comp, "message": msg} for m, lvl, comp, msg in entries]


def filter_logs(records: list[dict], level: str | None = None, component: str | None = None,
                contains: str | None = None, since_minutes: int | None = None) -> list[dict]:
    """Records at or above `level`, of `component`, containing `contains`, within the window."""
    if level is not None:
        floor = LOG_LEVELS.index(level)
        records = [r for r in records if LOG_LEVELS.index(r["level"]) >= floor]
    if component is not None:
        records = [r for r in records if r["component"] == component]
    if contains is not None:
        records = [r for r in records if contains.lower() in r["message"].lower()]
    if since_minutes is not None:
        cutoff = _at(since_minutes)
        records = [r for r in records if r["time"] >= cutoff]
    return records
