"""Runs over the workbench's turns: start one (a new message, a resumed approval, a fork), follow
it, wait for it, stop it.

- A run with input adds its one user message as a turn of the thread's branch
  (`TurnService.start_turn`): recorded, journaled and traced like a turn from the session page.
- A run with `command={"resume": ...}` decides the branch's pending approval (`TurnService.decide`)
  and the paused turn goes on: the same turn, so the same run id. The resume value is Arbor's
  `{"approved": bool, "comment": str}`, a bool, agent-inbox's response (`{"type": "accept" |
  "ignore" | "response", "args": ...}`, or a list of one), or a map of interrupt (approval) id to
  one of these.
- A run from a checkpoint (`checkpoint_id`, or `checkpoint`) that is not the branch's head forks:
  a new branch from that checkpoint (`BranchService.fork`), where the run goes on, so the run's
  `thread_id` (and its Content-Location) names a new thread and the thread asked for is left as
  it was. From the end of a turn the run adds its message there; from inside a turn (a
  checkpoint with a next node: before a tool ran, say) it takes no input and continues that
  turn from there (`TurnService.continue_branch`). An input checkpoint (its input not applied
  yet) stands for the one before it.
- One turn at a time on a branch: a run on a busy thread is refused (409), which is LangGraph's
  multitask strategy `reject`, the only one served.

Cancel stops the turn (`TurnService.cancel_turn`): its model request is closed and the branch
keeps its last completed turn, which is LangGraph's `rollback` and `interrupt` alike.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage
from pydantic import BaseModel, ConfigDict
from sqlmodel import Session, col, select

from app.agent.messages import from_openai
from app.db.checkpoints import branch_thread_id
from app.db.models import Approval, ApprovalStatus, Branch, BranchCreate, Turn, TurnCreate, TurnStatus
from app.errors import Conflict, NotFound, WorkbenchError
from app.platform import wire
from app.platform.stream import RunStream
from app.platform.threads import Threads
from app.services import branch_threads
from app.services.turn_log import TurnHandle
from app.services.turn_replay import RecordedTurn


class RunRequest(BaseModel):
    """The body of POST /threads/{id}/runs[/stream|/wait] (and /runs[...]: a new thread): the
    fields `langgraph_sdk`'s runs client sends. What Arbor cannot honour is refused (422);
    hints it has no use for (durability, feedback keys, tracing) are ignored."""

    model_config = ConfigDict(extra="ignore")
    assistant_id: str
    input: dict | None = None
    command: dict | None = None
    stream_mode: str | list[str] = "values"
    stream_subgraphs: bool = False
    stream_resumable: bool = False
    config: dict | None = None
    context: dict | None = None
    metadata: dict | None = None
    checkpoint_id: str | None = None
    checkpoint: dict | None = None
    interrupt_before: str | list[str] | None = None
    interrupt_after: str | list[str] | None = None
    webhook: str | None = None
    multitask_strategy: str | None = None
    if_not_exists: str | None = None
    on_disconnect: str | None = None
    on_completion: str | None = None
    after_seconds: float | None = None

    @property
    def modes(self) -> list[str]:
        return [self.stream_mode] if isinstance(self.stream_mode, str) else list(self.stream_mode)

    @property
    def options(self) -> dict:
        """The turn's options (force_tool, tool_choice) from `context`, else `config.configurable`."""
        return {**((self.config or {}).get("configurable") or {}), **(self.context or {})}


@dataclass
class StartedRun:
    """A run just started: its turn's live handle, and where it runs."""

    handle: TurnHandle
    thread_id: str
    graph_id: str


class Runs:
    def __init__(self, threads: Threads) -> None:
        self.threads = threads
        self.workbench = threads.workbench

    # -- starting ------------------------------------------------------------------------------
    async def start(self, thread_id: str | None, request: RunRequest) -> StartedRun:
        _refuse_unsupported(request)
        scenario = self.threads.scenario(request.assistant_id)
        if thread_id is None:  # a run without a thread: on a new one (kept, whatever on_completion says)
            thread_id = (await self.threads.create(scenario.name, None))["thread_id"]
        elif not await asyncio.to_thread(self.threads._exists, thread_id):
            if request.if_not_exists != "create":
                raise NotFound(f"unknown thread {thread_id!r}", "unknown_thread")
            await self.threads.create(scenario.name, thread_id, if_exists="do_nothing")
        rows = await asyncio.to_thread(self.threads._rows, thread_id)
        if rows.session.scenario != scenario.name:
            raise Conflict(f"thread {thread_id!r} is a session of {rows.session.scenario!r}, not of assistant "
                           f"{scenario.name!r}", "assistant_mismatch")
        turns = self.workbench.turns
        if request.command is not None:
            handle = await self._resume(rows.branch.id, request.command)
            return StartedRun(handle, thread_id, scenario.name)
        checkpoint_id = request.checkpoint_id or (request.checkpoint or {}).get("checkpoint_id")
        branch_id, continues = rows.branch.id, False
        if checkpoint_id:
            branch_id, continues = await self._fork_at(rows.branch, checkpoint_id)
        if continues:
            if _message(request.input, required=False) is not None:
                raise WorkbenchError(f"checkpoint {checkpoint_id!r} is inside a turn: a run from it continues that "
                                     "turn and takes no input", "input_inside_turn", 422)
            handle = await turns.continue_branch(rows.session.id, branch_id)
        else:
            options = request.options
            turn = TurnCreate(message=_message(request.input) or "", branch_id=branch_id,
                              force_tool=bool(options.get("force_tool", False)),
                              tool_choice=options.get("tool_choice"))
            handle = await turns.start_turn(rows.session.id, turn)
        return StartedRun(handle, branch_id, scenario.name)

    async def _resume(self, branch_id: str, command: dict) -> TurnHandle:
        if set(command) - {"resume"}:
            raise WorkbenchError("a command may only resume the approval the thread waits on (Command(resume=...)); "
                                 "update and goto are not served", "unsupported_command", 422)
        pending = await asyncio.to_thread(self._pending, branch_id)
        if not pending:
            raise Conflict(f"thread {branch_id!r} waits on no interrupt", "no_interrupt")
        approval = pending[0]
        approved, comment = _decision(command.get("resume"), approval.id)
        return await self.workbench.turns.decide(approval.id, approved, comment, "langgraph-api")

    def _pending(self, branch_id: str) -> list[Approval]:
        with Session(self.workbench.engine) as db:
            return list(db.exec(select(Approval).where(Approval.branch_id == branch_id,
                                                       Approval.status == ApprovalStatus.PENDING)
                                .order_by(col(Approval.created_at))).all())

    async def _fork_at(self, branch: Branch, checkpoint_id: str) -> tuple[str, bool]:
        """Where a run from `checkpoint_id` of `branch`'s thread goes: (branch id, whether it
        continues a turn). The branch's own head is no fork; any other checkpoint forks."""
        start = await asyncio.to_thread(self.threads._start, branch.id)
        graph, thread = self.workbench.graph, branch_thread_id(branch.id)
        snapshot = await branch_threads.snapshot_at(graph, thread, checkpoint_id)
        if snapshot is None:
            raise NotFound(f"unknown checkpoint {checkpoint_id!r} of thread {branch.id!r}", "unknown_checkpoint")
        if (snapshot.metadata or {}).get("source") == "input" and snapshot.parent_config:
            checkpoint_id = snapshot.parent_config["configurable"]["checkpoint_id"]  # its input is not applied yet
            snapshot = await branch_threads.snapshot_at(graph, thread, checkpoint_id)
            assert snapshot is not None  # the parent of a checkpoint of the thread
        if checkpoint_id == start.checkpoint_id and start.cut is None:
            return branch.id, False
        turn_id = (snapshot.metadata or {}).get("turn_id")
        if isinstance(turn_id, str) and turn_id:
            request = BranchCreate(turn_id=turn_id, checkpoint_id=checkpoint_id)
        elif not snapshot.next and checkpoint_id == branch.base_checkpoint_id:
            request = await asyncio.to_thread(self._base_fork, branch, bool(snapshot.values.get("messages")))
        else:
            raise WorkbenchError(f"checkpoint {checkpoint_id!r} belongs to no turn; fork from a turn's checkpoint",
                                 "checkpoint_not_forkable", 422)
        forked = await self.workbench.branches.fork(branch.session_id, request)
        return forked.id, bool(snapshot.next)

    def _base_fork(self, branch: Branch, has_messages: bool) -> BranchCreate:
        """A fork from a branch's base (before its first turn): what it was forked from."""
        with Session(self.workbench.engine) as db:
            source = db.get(Turn, branch.fork_turn_id) if branch.fork_turn_id else None
            if source is not None and source.status == TurnStatus.COMPLETED and branch.head_turn_id == source.id:
                return BranchCreate(turn_id=source.id)
            if not has_messages:
                return BranchCreate()
        raise WorkbenchError(f"branch {branch.id!r}'s base cannot be forked again; fork from the turn it was "
                             "forked from", "checkpoint_not_forkable", 422)

    # -- reading -------------------------------------------------------------------------------
    def stream(self, run_id: str, thread_id: str, graph_id: str, modes: list[str]) -> RunStream:
        return RunStream(modes, run_id=run_id, thread_id=thread_id, graph_id=graph_id,
                         start_values=lambda event: self._start_values(run_id, bool(event.get("resumed"))),
                         end_values=lambda event: self.end_values(run_id))

    async def _start_values(self, turn_id: str, resumed: bool) -> dict:
        """The state a turn's stream starts from: where it paused (resumed), else its start
        checkpoint with its message added (none when it continues a turn from its middle)."""
        turn = await asyncio.to_thread(self._turn, turn_id)
        thread = branch_thread_id(turn.branch_id)
        graph = self.workbench.graph
        if resumed or turn.start_checkpoint_id is None:
            snapshot = await graph.aget_state(branch_threads.thread_config(thread))
        else:
            snapshot = await branch_threads.snapshot_at(graph, thread, turn.start_checkpoint_id)
        values = dict(snapshot.values) if snapshot is not None and snapshot.created_at else {}
        messages = list(values.get("messages") or [])
        if not resumed and not (snapshot is not None and snapshot.next):
            messages.append(HumanMessage(content=turn.user_message))
        values["messages"] = [m if isinstance(m, BaseMessage) else from_openai([m])[0] for m in messages]
        return values

    async def end_values(self, turn_id: str) -> dict | None:
        """What a finished (or paused) run answers: the branch's state where the turn ended (with
        "__interrupt__" while it waits), or "__error__" for a failed or stopped one."""
        turn = await asyncio.to_thread(self._turn, turn_id)
        if turn.status in (TurnStatus.FAILED, TurnStatus.CANCELLED):
            return {"__error__": {"error": "cancelled" if turn.status == TurnStatus.CANCELLED else "failed",
                                  "message": turn.error or turn.status}}
        thread = branch_thread_id(turn.branch_id)
        graph = self.workbench.graph
        if turn.status == TurnStatus.COMPLETED and turn.end_checkpoint_id:
            snapshot = await branch_threads.snapshot_at(graph, thread, turn.end_checkpoint_id)
        else:
            snapshot = await graph.aget_state(branch_threads.thread_config(thread))
        values = wire.state_values(snapshot.values if snapshot is not None else {})
        if turn.status == TurnStatus.AWAITING_APPROVAL:
            pending = await asyncio.to_thread(self._pending, turn.branch_id)
            values["__interrupt__"] = [wire.approval_interrupt(a) for a in pending if a.turn_id == turn.id]
        return values

    def _turn(self, turn_id: str) -> Turn:
        with Session(self.workbench.engine) as db:
            turn = db.get(Turn, turn_id)
            if turn is None:
                raise NotFound(f"unknown run {turn_id!r}", "unknown_run")
            return turn

    def run(self, thread_id: str, run_id: str) -> tuple[Turn, str]:
        """The turn of run `run_id` on thread `thread_id` and its scenario; 404 otherwise."""
        with Session(self.workbench.engine) as db:
            turn = db.get(Turn, run_id)
            if turn is None or turn.branch_id != thread_id:
                raise NotFound(f"unknown run {run_id!r} of thread {thread_id!r}", "unknown_run")
            rows = self.threads.rows(db, thread_id)
            return turn, rows.session.scenario

    def list(self, thread_id: str, limit: int, offset: int, status: str | None) -> list[Any]:
        with Session(self.workbench.engine) as db:
            rows = self.threads.rows(db, thread_id)
            turns = db.exec(select(Turn).where(Turn.branch_id == thread_id)
                            .order_by(col(Turn.created_at).desc())).all()
            runs = [wire.run(t, rows.session.scenario) for t in turns]
        runs = [r for r in runs if status is None or r["status"] == status]
        return runs[offset:offset + max(1, min(limit, 1000))]

    async def follow(self, thread_id: str, run_id: str) -> tuple[TurnHandle | RecordedTurn, str]:
        _, graph_id = await asyncio.to_thread(self.run, thread_id, run_id)
        return await self.workbench.turns.follow(run_id), graph_id

    async def cancel(self, thread_id: str, run_id: str) -> None:
        """Stop the run's turn; a turn still being recorded is asked again for a few seconds."""
        await asyncio.to_thread(self.run, thread_id, run_id)
        for _ in range(50):
            try:
                await self.workbench.turns.cancel_turn(run_id)
                return
            except Conflict as exc:
                if exc.error_type != "turn_starting":
                    raise
                await asyncio.sleep(0.1)
        raise Conflict(f"run {run_id!r} is still starting", "turn_starting")


def _refuse_unsupported(request: RunRequest) -> None:
    if request.multitask_strategy not in (None, "reject"):
        raise WorkbenchError("one turn at a time runs on a branch: multitask_strategy 'reject' is the only one "
                             "served (a run on a busy thread is a 409)", "unsupported_multitask_strategy", 422)
    for name in ("interrupt_before", "interrupt_after", "webhook", "after_seconds"):
        if getattr(request, name):
            raise WorkbenchError(f"{name} is not served: the scenarios' graphs stop only for approvals",
                                 f"unsupported_{name}", 422)
    if request.command is not None and request.input is not None:
        raise WorkbenchError("a run takes input or a command, not both", "input_and_command", 422)


def _message(value: dict | None, required: bool = True) -> str | None:
    """The one user message of a run's input ({"messages": [one human message]})."""
    messages = (value or {}).get("messages")
    if not messages:
        if required:
            raise WorkbenchError("a run's input is {\"messages\": [one user message]} (or a command that resumes "
                                 "an interrupt)", "input_required", 422)
        return None
    if isinstance(messages, dict | str):
        messages = [messages]
    if len(messages) != 1:
        raise WorkbenchError("a run adds one user message to the thread (a turn); the history is the thread's",
                             "one_message", 422)
    message = messages[0]
    if isinstance(message, str):
        return message
    role = message.get("role") or message.get("type")
    if role not in ("user", "human"):
        raise WorkbenchError(f"a run's message must be the user's, got {role!r}", "user_message_required", 422)
    content = message.get("content")
    if isinstance(content, list):  # content blocks: their text
        content = "".join(str(b.get("text") or "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    return str(content or "")


def _decision(value: Any, approval_id: str) -> tuple[bool, str]:
    """(approved, comment) from a resume value (see the module docstring)."""
    if isinstance(value, dict) and approval_id in value:
        value = value[approval_id]
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if isinstance(value, bool):
        return value, ""
    if isinstance(value, str):
        return value.strip().lower() in ("approve", "approved", "accept", "yes", "y", "true"), ""
    if isinstance(value, dict):
        if "approved" in value:
            return bool(value["approved"]), str(value.get("comment") or "")
        kind = value.get("type")
        if kind in ("accept", "approve"):
            return True, ""
        if kind in ("ignore", "reject"):
            return False, ""
        if kind == "response":
            return False, str(value.get("args") or "")
    raise WorkbenchError('resume with {"approved": true|false, "comment": "..."}, a bool, or agent-inbox\'s '
                         '{"type": "accept"|"ignore"|"response"}', "invalid_resume", 422)
