"""The scenarios the workbench offers, by name.

`list_scenarios()` returns them in a fixed order; `get_scenario(name)` raises
`UnknownScenario` (a LookupError whose message lists the known names) for anything else.
"""

from __future__ import annotations

from scenarios.edge_incident.scenario import SCENARIO as EDGE_INCIDENT
from scenarios.field_maintenance.scenario import SCENARIO as FIELD_MAINTENANCE
from scenarios.financial_research.scenario import SCENARIO as FINANCIAL_RESEARCH
from scenarios.scenario import Scenario
from scenarios.story_writer.scenario import SCENARIO as STORY_WRITER
from tools.base import UnknownTool

__all__ = ["Scenario", "UnknownScenario", "UnknownTool", "get_scenario", "list_scenarios"]

_SCENARIOS: dict[str, Scenario] = {
    s.name: s for s in (FINANCIAL_RESEARCH, FIELD_MAINTENANCE, EDGE_INCIDENT, STORY_WRITER)
}


class UnknownScenario(LookupError):
    """No scenario has this name; the message lists the known ones."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"unknown scenario {name!r}; known: {', '.join(_SCENARIOS)}")

    def __str__(self) -> str:  # LookupError would quote the message like a key
        return str(self.args[0])


def list_scenarios() -> list[Scenario]:
    return list(_SCENARIOS.values())


def get_scenario(name: str) -> Scenario:
    try:
        return _SCENARIOS[name]
    except KeyError:
        raise UnknownScenario(name) from None
