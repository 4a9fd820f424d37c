"""Wiring of the edge_incident scenario: prompt, tools, starter questions, data summary."""

from __future__ import annotations

from scenarios.edge_incident import world
from scenarios.scenario import Scenario, read_prompt
from tools.incident import ACTIONS, INCIDENT_TOOLS


def _summary() -> dict:
    return {
        "service": world.SERVICE,
        "states": list(world.STATES),
        "endpoints": ["/health", "/status", "/metrics", "/logs", "/dependencies"],
        "actions_needing_approval": list(ACTIONS),
        "start": "python -m scenarios.edge_incident.service --state degraded --port 8765",
    }


SCENARIO = Scenario(
    name="edge_incident",
    title="Edge incident",
    description="Diagnose a simulated edge event service from its status, metrics, logs and "
                "dependencies; proposed actions wait for operator approval.",
    system_prompt=read_prompt(__file__),
    tools=INCIDENT_TOOLS,
    starter_questions=(
        "Is edge-event-api healthy? If not, what is wrong?",
        "Why did latency and errors rise in the last hour?",
        "Which dependency is failing, and what should we do about it?",
    ),
    summarize=_summary,
)
