"""Wiring of the field_maintenance scenario: prompt, tools, starter questions, data summary."""

from __future__ import annotations

from scenarios.field_maintenance.fleet import load_fleet
from scenarios.scenario import Scenario, read_prompt
from tools.maintenance import maintenance_tools


def _summary() -> dict:
    fleet = load_fleet()
    return {
        "devices": [{"id": d["id"], "type": d["type"], "site": d["site"], "status": d["status"]}
                    for d in fleet.devices],
        "telemetry": {"from": fleet.time(0), "to": fleet.time(fleet.hours - 1), "interval": "1h"},
        "events": len(fleet.events),
        "manual_sections": len(fleet.manual),
    }


SCENARIO = Scenario(
    name="field_maintenance",
    title="Field maintenance",
    description="A simulated fleet: device status, telemetry trends with anomaly detection, "
                "event logs and the service manual.",
    system_prompt=read_prompt(__file__),
    tools=maintenance_tools(load_fleet),
    starter_questions=(
        "Which devices need attention right now?",
        "What is wrong with PUMP-02 and what should the technician do?",
        "Were there any pressure anomalies on COMP-01 this week?",
        "Explain the W120 warning on TX-01.",
    ),
    summarize=_summary,
)
