"""The `Scenario` record: what the workbench needs to run one agent on its local data."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from langchain_core.tools import BaseTool

from tools.base import Tool, UnknownTool


@dataclass(frozen=True)
class Scenario:
    """A system prompt, the tools the agent may call, starter questions and its data.

    `summarize` returns a small JSON-serialisable description of the local data (for the home
    page); `data_summary()` calls it, so the data is read only when someone asks. A tool is
    the project's `Tool` or any langchain-core `BaseTool` (such as a `@tool` function).
    """

    name: str
    title: str
    description: str
    system_prompt: str
    tools: tuple[Tool | BaseTool, ...]
    starter_questions: tuple[str, ...]
    summarize: Callable[[], dict] = field(default=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = [t.name for t in self.tools]
        if len(names) != len(set(names)):
            raise ValueError(f"scenario {self.name}: duplicate tool names in {names}")

    def tool(self, name: str) -> Tool | BaseTool:
        """The tool called `name`; `UnknownTool` (a ToolError) lists the known names."""
        for tool in self.tools:
            if tool.name == name:
                return tool
        known = ", ".join(t.name for t in self.tools)
        raise UnknownTool(f"unknown tool {name!r} in scenario {self.name}; known: {known}")

    def data_summary(self) -> dict:
        """What local data the scenario has (e.g. companies and quarters)."""
        return self.summarize()


def read_prompt(package_file: str, name: str = "system_prompt.md") -> str:
    """Read a prompt shipped next to a scenario module (pass that module's `__file__`)."""
    return (Path(package_file).parent / name).read_text(encoding="utf-8").strip()
