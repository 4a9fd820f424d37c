"""The scenarios the app serves: scenarios.registry by default, or a given list (tests)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from app.errors import NotFound


class ScenarioCatalog:
    def __init__(self, scenarios: Iterable[Any] | None = None) -> None:
        if scenarios is None:
            from scenarios.registry import list_scenarios  # imported late: reads data lazily

            scenarios = list_scenarios()
        self._by_name = {s.name: s for s in scenarios}

    def list(self) -> list[Any]:
        return list(self._by_name.values())

    def get(self, name: str) -> Any:
        """The scenario called `name`; NotFound lists the known names."""
        try:
            return self._by_name[name]
        except KeyError:
            known = ", ".join(self._by_name) or "none"
            raise NotFound(f"unknown scenario {name!r}; known: {known}", "unknown_scenario") from None
