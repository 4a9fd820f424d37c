"""The LangGraph Platform API's objects, built from the workbench's rows and checkpoints.

Each builder returns one of `langgraph_sdk.schema`'s TypedDicts, the types the SDK reads the
answers as: mypy checks the shapes here against them and the tests validate every answer with
them (tests/app/test_platform_api.py). State values are the graph's state with its
langchain-core messages as their own `model_dump()` (what langgraph-api sends); JSON as it goes
out.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from langchain_core.messages import BaseMessage
from langgraph.types import StateSnapshot
from langgraph_sdk import schema
from pydantic import BaseModel

from app.agent.messages import from_openai
from app.db.models import Approval, Branch, Turn, TurnStatus

#: assistant ids are UUIDs derived from the scenario's name (stable across restarts and processes)
ASSISTANT_NAMESPACE = uuid.UUID("5d1f8a4e-2f0b-4d6c-9a43-7c2b0e3a9f61")
PLATFORM_VERSION = "0.1.0"


def assistant_id(scenario_name: str) -> str:
    return str(uuid.uuid5(ASSISTANT_NAMESPACE, scenario_name))


def utc(moment: datetime | None) -> datetime:
    """SQLite hands datetimes back naive; they were written in UTC."""
    moment = moment or datetime.now(UTC)
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def jsonable(value: Any) -> Any:
    """`value` with langchain-core messages (and any pydantic model) as their `model_dump()`,
    OpenAI message dicts of old threads as langchain-core's, the rest as JSON has it."""
    if isinstance(value, BaseMessage | BaseModel):
        return jsonable(value.model_dump())
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, datetime):
        return utc(value).isoformat()
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def state_values(values: dict | None) -> dict[str, Any]:
    """A checkpoint's values as the API shows them (messages as langchain-core dumps)."""
    values = dict(values or {})
    messages = values.get("messages") or []
    values["messages"] = [m if isinstance(m, BaseMessage) else from_openai([m])[0] for m in messages]
    return jsonable(values)


def assistant(scenario: Any, created_at: datetime) -> schema.Assistant:
    return schema.Assistant(
        assistant_id=assistant_id(scenario.name), graph_id=scenario.name, config=schema.Config(), context={},
        created_at=created_at, updated_at=created_at, version=1, name=scenario.name,
        description=scenario.description,
        metadata={"created_by": "system", "title": scenario.title, "tools": [t.name for t in scenario.tools],
                  "starter_questions": list(scenario.starter_questions)})


def checkpoint(thread_id: str, checkpoint_id: str | None) -> schema.Checkpoint:
    return schema.Checkpoint(thread_id=thread_id, checkpoint_ns="", checkpoint_id=checkpoint_id, checkpoint_map=None)


def approval_interrupt(approval: Approval) -> schema.Interrupt:
    """A pending approval as the interrupt a client resumes: Arbor's own payload (what the graph's
    interrupt carries, with the approval's id) and agent-inbox's `action_request` / `config`,
    which agent-chat-ui renders with accept / ignore / respond buttons."""
    arguments = approval.arguments or {}
    return schema.Interrupt(id=approval.id, value={
        "approval_id": approval.id, "turn_id": approval.turn_id, "tool_call_id": approval.tool_call_id,
        "tool_name": approval.tool_name, "arguments": arguments,
        "action_request": {"action": approval.tool_name, "args": arguments},
        "config": {"allow_accept": True, "allow_ignore": True, "allow_respond": True, "allow_edit": False},
        "description": f"The agent proposes {approval.tool_name}; approve to run it, ignore (or respond) to "
                       "reject it.",
    })


def raw_interrupt(item: Any) -> schema.Interrupt:
    return schema.Interrupt(id=str(getattr(item, "id", "")), value=jsonable(getattr(item, "value", None)))


def interrupts_of(snapshot: StateSnapshot | None, pending: list[Approval]) -> list[schema.Interrupt]:
    """The interrupts a state waits on: its pending approvals (the workbench's truth), else those
    its checkpoint recorded."""
    if pending:
        return [approval_interrupt(a) for a in pending]
    if snapshot is None:
        return []
    return [raw_interrupt(i) for task in snapshot.tasks for i in task.interrupts]


def thread_state(thread_id: str, snapshot: StateSnapshot, pending: list[Approval]) -> schema.ThreadState:
    """One checkpoint of a branch's LangGraph thread as the API's ThreadState."""
    parent = snapshot.parent_config["configurable"].get("checkpoint_id") if snapshot.parent_config else None
    interrupts = interrupts_of(snapshot, pending)
    tasks = [schema.ThreadTask(id=task.id, name=task.name, error=repr(task.error) if task.error else None,
                               interrupts=interrupts if task.interrupts else [], checkpoint=None, state=None,
                               result=jsonable(task.result) if task.result is not None else None)
             for task in snapshot.tasks]
    return schema.ThreadState(
        values=state_values(snapshot.values), next=list(snapshot.next),
        checkpoint=checkpoint(thread_id, snapshot.config["configurable"]["checkpoint_id"]),
        metadata=jsonable(snapshot.metadata or {}), created_at=snapshot.created_at,
        parent_checkpoint=checkpoint(thread_id, parent) if parent else None, tasks=tasks, interrupts=interrupts)


def empty_state(thread_id: str, values: dict) -> schema.ThreadState:
    """The state of a branch whose thread has no checkpoint yet (a new session's main branch)."""
    return schema.ThreadState(values=values, next=[], checkpoint=checkpoint(thread_id, None), metadata={},
                              created_at=None, parent_checkpoint=None, tasks=[], interrupts=[])


def thread_status(busy: Turn | None, last: Turn | None) -> schema.ThreadStatus:
    """busy while a turn runs, interrupted while one waits for an approval, error when the
    branch's last turn failed (it can be retried), idle otherwise."""
    if busy is not None:
        return "interrupted" if busy.status == TurnStatus.AWAITING_APPROVAL else "busy"
    return "error" if last is not None and last.status == TurnStatus.FAILED else "idle"


def thread_metadata(branch: Branch, scenario_name: str, title: str) -> dict[str, Any]:
    return {"graph_id": scenario_name, "assistant_id": assistant_id(scenario_name), "title": title or None,
            "arbor_session_id": branch.session_id, "arbor_branch_name": branch.name,
            "arbor_fork_turn_id": branch.fork_turn_id, "arbor_fork_checkpoint_id": branch.fork_checkpoint_id}


def thread(branch: Branch, scenario_name: str, title: str, status: schema.ThreadStatus, values: dict,
           interrupts: list[schema.Interrupt], updated_at: datetime | None) -> schema.Thread:
    return schema.Thread(thread_id=branch.id, created_at=utc(branch.created_at),
                         updated_at=utc(updated_at or branch.created_at),
                         metadata=thread_metadata(branch, scenario_name, title), status=status, values=values,
                         interrupts={interrupt["id"]: [interrupt] for interrupt in interrupts})


def run_status(turn: Turn) -> schema.RunStatus:
    """A turn's status as a run's: `interrupted` both when it waits for an approval and when it
    was stopped (the turn's own status is in the run's metadata)."""
    statuses: dict[str, schema.RunStatus] = {
        TurnStatus.RUNNING: "running", TurnStatus.COMPLETED: "success", TurnStatus.FAILED: "error",
        TurnStatus.AWAITING_APPROVAL: "interrupted", TurnStatus.CANCELLED: "interrupted"}
    return statuses.get(turn.status, "error")


def run(turn: Turn, scenario_name: str) -> schema.Run:
    return schema.Run(run_id=turn.id, thread_id=turn.branch_id, assistant_id=assistant_id(scenario_name),
                      created_at=utc(turn.created_at), updated_at=utc(turn.finished_at or turn.created_at),
                      status=run_status(turn), multitask_strategy="reject",
                      cancel_reason="user" if turn.status == TurnStatus.CANCELLED else None,
                      metadata={"arbor_turn_status": turn.status, "arbor_session_id": turn.session_id,
                                "arbor_parent_turn_id": turn.parent_turn_id, "outcome": turn.outcome,
                                "error": turn.error, "input": turn.user_message})
