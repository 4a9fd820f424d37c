"""Scenarios: list, detail (with data summary), and running one tool directly."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from app.agent.relevance import RelevanceQuery
from app.agent.scenario_tools import parameters, requires_approval, run_outside_turn
from app.agent.trimming import trim_tool_result
from app.api.deps import CatalogDep, SettingsDep, TurnServiceDep
from app.errors import Conflict, WorkbenchError
from tools.base import ToolError

router = APIRouter(prefix="/scenarios", tags=["scenarios"])


def scenario_public(scenario: Any, detail: bool = False) -> dict:
    body = {
        "name": scenario.name,
        "title": scenario.title,
        "description": scenario.description,
        "starter_questions": list(scenario.starter_questions),
        "tools": [{"name": t.name, "description": t.description, "parameters": parameters(t),
                   "requires_approval": requires_approval(t)} for t in scenario.tools],
    }
    if detail:
        body["system_prompt"] = scenario.system_prompt
        body["data"] = scenario.data_summary()
    return body


class ToolRunRequest(BaseModel):
    arguments: dict = Field(default_factory=dict)


@router.get("")
def list_scenarios(catalog: CatalogDep) -> list[dict]:
    return [scenario_public(s) for s in catalog.list()]


@router.get("/{name}")
def get_scenario(name: str, catalog: CatalogDep) -> dict:
    return scenario_public(catalog.get(name), detail=True)


@router.post("/{name}/tools/{tool_name}")
async def run_scenario_tool(name: str, tool_name: str, request: ToolRunRequest, catalog: CatalogDep,
                            turns: TurnServiceDep, settings: SettingsDep) -> dict:
    """Run one tool outside any session (tool check / playground). Proposed actions are refused."""
    scenario = catalog.get(name)
    try:
        tool = scenario.tool(tool_name)
    except ToolError as exc:
        raise WorkbenchError(str(exc), "unknown_tool", 404) from None
    if requires_approval(tool):
        raise Conflict(f"{tool_name} is a proposed action: it is never executed directly, only proposed "
                       "by the agent and decided by the operator", "requires_approval")
    t0 = time.perf_counter()
    try:
        result = await run_outside_turn(tool, turns.tool_context, request.arguments)
    except ToolError as exc:
        raise WorkbenchError(str(exc), "tool_error", 422) from None
    except Exception as exc:  # noqa: BLE001 - any failure of the tool becomes the API's error
        raise WorkbenchError(f"tool {tool_name} raised {type(exc).__name__}: {exc}", "tool_failed", 500) from None
    # no turn, no question: a long list is ranked by the arguments alone (and its faults)
    shaped = trim_tool_result(result, settings.tool_result_budget_chars, "(not stored)",
                              RelevanceQuery("", request.arguments))
    return {"tool": tool_name, "result": result, "context_text": shaped.context_text, "trimmed": shaped.trimmed,
            "full_chars": shaped.full_chars, "ranking": shaped.ranking_report(),
            "duration_ms": round((time.perf_counter() - t0) * 1000, 3)}
