"""Running turns: validate, record, drive the agent graph, stream its events.

A turn runs as a background task that appends events to its log (app/services/turn_log.py);
the HTTP response (SSE or a collected JSON answer) reads that log, and so can any later reader
(`GET /api/turns/{id}/events`: replay, then follow). The run therefore finishes and is
recorded even when the client disconnects. `cancel` stops it: the task is cancelled inside
the graph, which closes the model request (the server frees its slot), the turn and run are
marked `cancelled` and nothing else moves: the branch head stays at its last completed turn,
whose end checkpoint the next turn starts from.

Event types (each a dict with "type"):
  turn            {turn_id, run_id, session_id, branch_id, parent_turn_id, resumed, retry_of}
  token           {text}
  compacted       {step, span_id, tokens_before, tokens_after, reduced_turns, dropped_turns}
                  (before a model call whose history was compacted to fit the context)
  model_call      {step, span_id, prompt_tokens, completion_tokens, cached_tokens, cache_source,
                   ttft_ms, duration_ms, finish_reason}
  tool_call       {tool_call_id, name, arguments (JSON text), step}
  tool_result     {tool_call_id, name, content, error, trimmed, full_chars, artifact_id, duration_ms, span_id}
  approval_request{approval_id, turn_id, tool_call_id, tool_name, arguments}    (the stream ends here)
  final           {turn_id, branch_id, content, outcome, steps}                  (the stream ends here)
  error           {turn_id, message, error_type, retryable}                      (the stream ends here)
  cancelled       {turn_id, message}                                              (the stream ends here)

Each branch is one LangGraph thread ("branch-<branch id>") whose checkpoint state holds the
conversation. A turn's graph input is only the new user message and the per-turn resets
(steps, budget, awaiting, decisions, answer, outcome); it runs from an explicit checkpoint
of the thread: the end of the branch's head turn, or the branch's base when its head is the
parent's turn it was forked from (app/services/branch_threads.py). The turn records both
checkpoints (start, end) and, in its run's options, `history_len`: how many messages of the
state belong to earlier turns (the state's message count at its start), which the context
budget must know to compact.

A failed turn (the model backend failed, or the workbench stopped under it: see
app/services/recovery.py) is retried as a new turn with the same message and options, on the
same branch from the same parent, so from the parent's end checkpoint: the failed turn's
half-advanced checkpoints are never continued, and the failed turn stays in the tree as it was.
The files its tools wrote went with it (they are staged until a turn completes:
app/services/workspace.py), so the retry finds the branch's files as the failed turn did.

Database work runs in worker threads (`asyncio.to_thread`), never on the event loop that
streams every turn. When a turn ends (answer, budget, failure; not a pause for approval) the
inference server is told its branch is done (app/agent/cache_hints.py) before the event
stream closes, so a next turn's hints always come after it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from langgraph.types import Command, Overwrite
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select, update

from app.agent.cache_hints import CacheHints, hint_key
from app.agent.context import TurnContext
from app.agent.context_budget import ContextBudget
from app.agent.context_state import ContextState
from app.agent.messages import from_openai
from app.agent.model_client import ModelAdapter, ModelBackendError
from app.db.checkpoints import branch_thread_id
from app.db.models import (
    ACTIVE_TURN_STATES, AgentSession, Approval, Branch, Run, Turn, TurnCreate, TurnPublic, utcnow,
)
from app.errors import Conflict, MessageTooLong, NotFound, WorkbenchError
from app.scenario_catalog import ScenarioCatalog
from app.services import branch_threads, workspace
from app.services import sessions as sessions_service
from app.services.remote_cancel import CancelWatcher, stamp_request, wait_ended
from app.services.traces import session_artifact_text
from app.services.turn_journal import TurnJournal, append_event, segment_of
from app.services.turn_log import TurnHandle
from app.services.turn_replay import FollowTiming, RecordedTurn
from app.services.workspace import BranchWorkspace
from app.settings import WorkbenchSettings
from app.tracing import TraceRecorder
from tools.base import ToolContext

log = logging.getLogger(__name__)

CANCELLED = "stopped by the user; the branch continues from its last completed turn"
CANCEL_WAIT_S = 30.0  # how long a cancel passed to another process waits for the turn to end


@dataclass(frozen=True)
class TurnStart:
    """Where a new turn starts on its branch's thread: `checkpoint_id`, or, where the branch has
    no checkpoint to start from (yet, or any more), a first one to write holding `seed`: the
    history its turn tree records.

    A branch forked inside turn `cut` starts from that turn's middle: its first turn continues
    `cut` (same message, no new input; `history_len` is `cut`'s) instead of adding a message."""

    thread_id: str
    checkpoint_id: str | None
    seed: list[dict]
    is_base: bool  # the branch's base (its first turn), not its head turn's end
    cut: Turn | None = None
    cut_history_len: int = 0


class TurnService:
    def __init__(self, settings: WorkbenchSettings, engine: Engine, graph: Any, adapter: ModelAdapter,
                 catalog: ScenarioCatalog, budget: ContextBudget, owner: str | None = None,
                 alive: Callable[[str | None], bool] = lambda owner: False) -> None:
        self.owner = owner  # this process's id, recorded on the runs it runs (app/services/liveness.py)
        self.alive = alive  # whether the process of a run's owner still runs (for followers)
        self.follow_timing = FollowTiming(poll_s=settings.follow_poll_s)
        self.settings, self.engine, self.graph, self.adapter, self.catalog = settings, engine, graph, adapter, catalog
        self.budget = budget
        self.hints = CacheHints(settings.llm_base_url, settings.llm_api_key)
        self._tasks: set[asyncio.Task] = set()
        self._live: dict[str, TurnHandle] = {}  # turn id -> the handle of a turn this process runs
        # On SQLite (one workbench process per database file) no other process can ask for a cancel.
        self.cancels = CancelWatcher(engine, owner if engine.dialect.name == "postgresql" else None, self._live,
                                     settings.follow_poll_s)
        # Check-then-write steps (branch busy? approval pending?) run in worker threads now;
        # this keeps each one atomic against a concurrent request, as the event loop did.
        self._record_lock = threading.Lock()
        self.tool_context = ToolContext(incident_base_url=settings.incident_base_url,
                                        http_timeout_s=settings.incident_timeout_s)

    # -- public operations ---------------------------------------------------------------------
    def validate_message(self, message: str) -> str:
        if not message or not message.strip():
            raise WorkbenchError("message must not be empty", "empty_message", 422)
        if len(message) > self.settings.max_message_chars:
            raise MessageTooLong(f"message has {len(message)} characters; the limit is "
                                 f"{self.settings.max_message_chars} (ARBOR_MAX_MESSAGE_CHARS)")
        return message

    async def start_turn(self, session_id: str, request: TurnCreate, retry_of: str | None = None) -> TurnHandle:
        """Validate and record a new turn, then run it in the background (`retry_of`: the
        failed turn it runs again, recorded in the run's options and the first event)."""
        handle, first, graph_input, context, start = await asyncio.to_thread(
            self._record_turn, session_id, request, retry_of)
        try:
            checkpoint_id, history_len = await self._open_start(start)
            await asyncio.to_thread(self._record_start, context, start, checkpoint_id, history_len)
        except Exception as exc:  # the turn is recorded `running`: it must not stay so
            await asyncio.to_thread(self._fail, context, f"the turn could not start: {exc}", "start_failed", True)
            raise
        context.history_len = history_len
        handle.emit(first)  # here, on the loop: the log wakes its readers with asyncio events
        self._launch(handle, graph_input, context, self._run_config(start.thread_id, checkpoint_id, context))
        return handle

    def _record_turn(self, session_id: str, request: TurnCreate,
                     retry_of: str | None) -> tuple[TurnHandle, dict, dict, TurnContext, TurnStart]:
        message = self.validate_message(request.message)
        with self._record_lock, Session(self.engine) as db:
            session = sessions_service.get_session(db, session_id)
            scenario = self.catalog.get(session.scenario)
            branch = sessions_service.get_branch(db, session, request.branch_id)
            if request.tool_choice is not None:
                _check_tool_choice(request.tool_choice, scenario)
            busy = sessions_service.busy_turn(db, branch)
            if busy is not None:
                raise _branch_busy(branch.id, busy)
            parent = db.get(Turn, branch.head_turn_id) if branch.head_turn_id else None
            start = _turn_start(db, branch, parent)
            if start.cut is not None and message != start.cut.user_message:
                raise Conflict(f"branch {branch.id!r} was forked inside turn {start.cut.id!r}: its first turn "
                               "continues that turn (POST .../branches/{id}/continue)", "branch_continues_turn")
            turn = Turn(session_id=session.id, branch_id=branch.id, parent_turn_id=branch.head_turn_id,
                        depth=(parent.depth + 1) if parent else 0, user_message=message, status="running")
            db.add(turn)
            try:  # the database holds the branch lock (models.Turn's unique partial index)
                db.flush()
            except IntegrityError:
                db.rollback()  # another workbench process started a turn on the branch just now
                busy = sessions_service.busy_turn(db, branch)
                if busy is None:
                    raise
                raise _branch_busy(branch.id, busy) from None
            run = Run(session_id=session.id, branch_id=branch.id, turn_id=turn.id, thread_id=start.thread_id,
                      owner=self.owner, options={"force_tool": request.force_tool, "tool_choice": request.tool_choice,
                               **({"retry_of": retry_of} if retry_of else {})})
            db.add(run)
            db.commit()
            handle = TurnHandle(turn.id, run.id, journal=self._journal(turn, segment=0))
            first = {"type": "turn", "turn_id": turn.id, "run_id": run.id, "session_id": session.id,
                     "branch_id": branch.id, "parent_turn_id": turn.parent_turn_id, "resumed": False,
                     "retry_of": retry_of}
            context = self._context(session, turn, run, scenario)
        # Only this turn's input: the history is in the checkpoint it starts from. `decisions`
        # merges by reducer, so its reset must overwrite. A continued turn takes no input: the
        # graph runs its pending step.
        graph_input = None if start.cut is not None else {
            "messages": from_openai([{"role": "user", "content": message}]), "steps": 0,
            "max_steps": self.settings.step_budget,
            "awaiting": [], "decisions": Overwrite({}), "final_answer": None, "outcome": None}
        return handle, first, graph_input, context, start

    async def _open_start(self, start: TurnStart) -> tuple[str, int]:
        """The checkpoint the turn starts from and the number of messages its state holds (all
        of earlier turns). Where the branch has none yet, or the checkpointer lost it (its store
        was reset), the history the turn tree records is written as a first checkpoint."""
        checkpoint_id = start.checkpoint_id
        snapshot = await branch_threads.snapshot_at(self.graph, start.thread_id, checkpoint_id) \
            if checkpoint_id else None
        if start.cut is not None:
            if snapshot is None:  # a turn's middle is in no table: nothing to seed it from
                raise WorkbenchError(f"checkpoint {checkpoint_id!r} of thread {start.thread_id!r} is gone; "
                                     "fork again", "checkpoint_missing", 409)
            return checkpoint_id, start.cut_history_len
        if snapshot is None:
            if checkpoint_id is not None:
                log.warning("checkpoint %s of %s is gone; seeding the thread from the recorded turns",
                            checkpoint_id, start.thread_id)
            checkpoint_id = await branch_threads.seed_thread(self.graph, start.thread_id, start.seed)
            snapshot = await branch_threads.snapshot_at(self.graph, start.thread_id, checkpoint_id)
        return checkpoint_id, len(snapshot.values.get("messages") or [])

    def _record_start(self, context: TurnContext, start: TurnStart, checkpoint_id: str, history_len: int) -> None:
        with Session(self.engine) as db:
            turn, run = db.get(Turn, context.turn_id), db.get(Run, context.run_id)
            turn.start_checkpoint_id = checkpoint_id
            run.options = {**(run.options or {}), "history_len": history_len}
            db.add(turn)
            db.add(run)
            if start.is_base and checkpoint_id != start.checkpoint_id:  # just written: retries start there too
                branch = db.get(Branch, turn.branch_id)
                branch.base_checkpoint_id = checkpoint_id
                db.add(branch)
            db.commit()

    @staticmethod
    def _run_config(thread_id: str, checkpoint_id: str | None, context: TurnContext) -> dict:
        # The turn's ids go into each checkpoint's metadata: the checkpoint list shows them.
        return branch_threads.thread_config(thread_id, checkpoint_id, turn_id=context.turn_id,
                                            branch_id=context.branch_id)

    async def retry_turn(self, turn_id: str) -> TurnHandle:
        """Run a failed turn's message again (same options) as a new turn on its branch.
        409 unless the turn failed and its branch still ends where the turn started (a branch
        that moved on since would put the retry after newer turns: fork from the parent instead)."""
        session_id, request = await asyncio.to_thread(self._retry_request, turn_id)
        return await self.start_turn(session_id, request, retry_of=turn_id)

    async def continue_branch(self, session_id: str, branch_id: str) -> TurnHandle:
        """Run the first turn of a branch forked inside a turn: that turn's message, continued
        from the fork's checkpoint (409 for a branch not forked so, or already continued)."""
        request = await asyncio.to_thread(self._continue_request, session_id, branch_id)
        return await self.start_turn(session_id, request)

    def _continue_request(self, session_id: str, branch_id: str) -> TurnCreate:
        with Session(self.engine) as db:
            branch = sessions_service.get_branch(db, sessions_service.get_session(db, session_id), branch_id)
            head = db.get(Turn, branch.head_turn_id) if branch.head_turn_id else None
            cut = _turn_start(db, branch, head).cut
            if cut is None:
                raise Conflict(f"branch {branch_id!r} has no turn to continue (it was not forked inside a turn, "
                               "or its first turn ran)", "nothing_to_continue")
            run = db.exec(select(Run).where(Run.turn_id == cut.id).order_by(Run.started_at)).first()
            options = (run.options if run else None) or {}
            return TurnCreate(message=cut.user_message, branch_id=branch.id,
                              force_tool=bool(options.get("force_tool")), tool_choice=options.get("tool_choice"))

    def _retry_request(self, turn_id: str) -> tuple[str, TurnCreate]:
        with Session(self.engine) as db:
            turn = sessions_service.get_turn(db, turn_id)
            if turn.status not in ("failed", "cancelled"):
                raise Conflict(f"turn {turn_id!r} is {turn.status}; only a failed or cancelled turn can be retried",
                               "turn_not_failed")
            branch = db.get(Branch, turn.branch_id)
            if branch.head_turn_id != turn.parent_turn_id:
                raise Conflict(f"branch {branch.id!r} has moved on since turn {turn_id!r} failed (its head is now "
                               f"{branch.head_turn_id!r}); fork a branch from {turn.parent_turn_id!r} and send the "
                               "message there", "branch_moved")
            run = sessions_service.latest_run(db, turn.id)
            options = (run.options if run else None) or {}
            request = TurnCreate(message=turn.user_message, branch_id=turn.branch_id,
                                 force_tool=bool(options.get("force_tool")), tool_choice=options.get("tool_choice"))
            return turn.session_id, request

    async def conversation(self, session_id: str, branch_id: str | None) -> tuple[Branch, list[dict]]:
        """The branch (`branch_id`, or the session's active one) and the conversation its next
        turn starts from (OpenAI messages, no system prompt), read from its thread."""
        branch, messages, _ = await self.next_start(session_id, branch_id)
        return branch, messages

    async def next_start(self, session_id: str, branch_id: str | None) -> tuple[Branch, list[dict], ContextState]:
        """`conversation`, with the branch's context state there (its compaction level, its
        estimate: what the next turn's first model call fits the context from)."""
        branch, start = await asyncio.to_thread(self._branch_start, session_id, branch_id)
        snapshot = await branch_threads.snapshot_at(self.graph, start.thread_id, start.checkpoint_id) \
            if start.checkpoint_id else None
        if snapshot is None:  # what its next turn would seed the thread with (see _open_start)
            return branch, start.seed, ContextState()
        return (branch, branch_threads.openai_messages(snapshot.values.get("messages") or []),
                ContextState.of(snapshot.values.get("context_fit")))

    def _branch_start(self, session_id: str, branch_id: str | None) -> tuple[Branch, TurnStart]:
        with Session(self.engine) as db:
            branch = sessions_service.get_branch(db, sessions_service.get_session(db, session_id), branch_id)
            head = db.get(Turn, branch.head_turn_id) if branch.head_turn_id else None
            return branch, _turn_start(db, branch, head)

    async def decide(self, approval_id: str, approved: bool, comment: str,
                     decided_by: str | None = None) -> TurnHandle:
        """Record the operator's decision (and who made it) and resume the paused run."""
        handle, first, context, thread_id = await asyncio.to_thread(
            self._record_decision, approval_id, approved, comment, decided_by)
        handle.emit(first)
        # No checkpoint id: the paused checkpoint is the thread's latest (its branch is busy).
        self._launch(handle, Command(resume={"approved": approved, "comment": comment}), context,
                     self._run_config(thread_id, None, context))
        return handle

    def _record_decision(self, approval_id: str, approved: bool, comment: str,
                         decided_by: str | None) -> tuple[TurnHandle, dict, TurnContext, str]:
        with self._record_lock, Session(self.engine) as db:
            approval = db.get(Approval, approval_id)
            if approval is None:
                raise NotFound(f"unknown approval {approval_id!r}", "unknown_approval")
            if approval.status != "pending":
                raise Conflict(f"approval {approval_id!r} is already {approval.status}", "approval_decided")
            turn = db.get(Turn, approval.turn_id)
            run = db.get(Run, approval.run_id)
            session = db.get(AgentSession, approval.session_id)
            if turn is None or run is None or session is None or turn.status != "awaiting_approval":
                raise Conflict(f"the turn of approval {approval_id!r} is not waiting for a decision",
                               "approval_stale")
            scenario = self.catalog.get(session.scenario)
            # Claimed in the database: of two processes deciding at once, one updates the
            # pending row, the other finds it decided (PostgreSQL re-checks the WHERE after the
            # first commits) and answers 409, so one turn never resumes twice.
            claimed = db.execute(update(Approval).where(Approval.id == approval_id, Approval.status == "pending")
                                 .values(status="approved" if approved else "rejected", comment=comment,
                                         decided_at=utcnow(), decided_by=decided_by))
            if claimed.rowcount != 1:
                db.rollback()
                raise Conflict(f"approval {approval_id!r} was decided meanwhile", "approval_decided")
            turn.status = run.status = "running"
            run.owner = self.owner  # the process resuming it runs it now
            for row in (turn, run):
                db.add(row)
            segment = segment_of(db, turn.id)  # counts the decision just claimed
            db.commit()
            handle = TurnHandle(turn.id, run.id, journal=self._journal(turn, segment))
            first = {"type": "turn", "turn_id": turn.id, "run_id": run.id, "session_id": session.id,
                     "branch_id": turn.branch_id, "parent_turn_id": turn.parent_turn_id, "resumed": True,
                     "retry_of": (run.options or {}).get("retry_of")}
            context = self._context(session, turn, run, scenario)
            thread_id = run.thread_id
        return handle, first, context, thread_id

    # -- cancel and rejoin ------------------------------------------------------------------------
    async def cancel_turn(self, turn_id: str) -> TurnPublic:
        """Stop turn `turn_id` and answer how it ended: `cancelled`, or, when it was already
        recording its outcome, that outcome. A running turn's model request is closed (its task
        is cancelled in the graph); a turn waiting for an approval is cancelled with its
        approval. A turn another workbench process runs is stopped by that process
        (app/services/remote_cancel.py): this one waits for it to end (at most CANCEL_WAIT_S,
        then answers the turn as it stands); one whose process died is ended here. Conflict
        (`turn_not_running`) for a turn that had already ended, and (`turn_starting`) for one
        this process is still recording."""
        handle = self._live.get(turn_id)
        if handle is not None:
            handle.request_cancel()
            await asyncio.wait({handle.task})  # not cancelled with this request: the turn ends regardless
            # A task that was just recording a pause (its stream had already ended at the
            # approval request) ends paused, not cancelled: the pause is cancelled like any other.
            if (await asyncio.to_thread(self.turn_public, turn_id)).status == "awaiting_approval":
                session_key = await asyncio.to_thread(self._cancel_recorded, turn_id)
                if session_key is not None:
                    await self.hints.turn_ended(session_key)
        else:
            session_key = await asyncio.to_thread(self._cancel_recorded, turn_id)
            if session_key is None:  # passed on to the process running it
                await wait_ended(self.engine, turn_id, self.follow_timing.poll_s, CANCEL_WAIT_S)
            else:
                await self.hints.turn_ended(session_key)
        return await asyncio.to_thread(self.turn_public, turn_id)

    def _cancel_recorded(self, turn_id: str) -> str | None:
        """Cancel a turn no task of this process runs: ask its running process (None), or end it
        here (a paused turn, or one whose process died) and return its cache session key."""
        with self._record_lock, Session(self.engine) as db:
            turn = sessions_service.get_turn(db, turn_id)
            if turn.status == "running":
                run = sessions_service.latest_run(db, turn.id)
                owner = run.owner if run else None
                if owner is not None and owner == self.owner:
                    raise Conflict(f"turn {turn_id!r} is just starting; try again in a moment", "turn_starting")
                if owner is not None and self.alive(owner):
                    stamp_request(db, run)
                    db.commit()
                    return None
            elif turn.status != "awaiting_approval":
                raise Conflict(f"turn {turn_id!r} is {turn.status}; only a running turn can be stopped",
                               "turn_not_running")
            now = utcnow()  # paused, or its process is dead: nothing runs it, it ends here
            for run in db.exec(select(Run).where(Run.turn_id == turn.id,
                                                 col(Run.status).in_(ACTIVE_TURN_STATES))).all():
                run.status, run.error, run.ended_at = "cancelled", CANCELLED, now
                db.add(run)
            for approval in db.exec(select(Approval).where(Approval.turn_id == turn.id,
                                                           Approval.status == "pending")).all():
                approval.status, approval.comment, approval.decided_at = "cancelled", CANCELLED, now
                db.add(approval)
            turn.status, turn.error, turn.finished_at = "cancelled", CANCELLED, now
            db.add(turn)
            workspace.discard(db, turn)  # a paused turn may have written files on an earlier approval
            append_event(db, turn, {"type": "cancelled", "turn_id": turn.id, "message": CANCELLED})
            db.commit()
            return hint_key(turn.session_id, turn.branch_id)

    async def follow(self, turn_id: str) -> TurnHandle | RecordedTurn:
        """The events of turn `turn_id`, replayed from its (current segment's) start and then
        followed until it ends: from the live log of a turn this process runs, otherwise from
        its journal in the database, whichever process runs it (app/services/turn_replay.py)."""
        handle = self._live.get(turn_id)
        if handle is not None:
            return handle
        return await asyncio.to_thread(RecordedTurn(self.engine, turn_id, self.alive, self.follow_timing).open)

    def _journal(self, turn: Turn, segment: int) -> TurnJournal:
        return TurnJournal(self.engine, session_id=turn.session_id, branch_id=turn.branch_id, turn_id=turn.id,
                           segment=segment, flush_s=self.settings.event_flush_s)

    async def shutdown(self) -> None:
        """Wait briefly for running turns, then cancel what is left (they are marked failed)."""
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=5)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        await self.cancels.stop()
        await self.hints.close()

    # -- the run itself --------------------------------------------------------------------------
    def _context(self, session: AgentSession, turn: Turn, run: Run, scenario: Any) -> TurnContext:
        options = run.options or {}
        recorder = TraceRecorder(self.engine, session_id=session.id, branch_id=turn.branch_id, turn_id=turn.id,
                                 run_id=run.id, base_url=self.settings.llm_base_url)
        return TurnContext(session_id=session.id, branch_id=turn.branch_id, turn_id=turn.id, run_id=run.id,
                           scenario=scenario, adapter=self.adapter, budget=self.budget, recorder=recorder,
                           tool_context=replace(self.tool_context, artifact_reader=partial(
                               session_artifact_text, self.engine, session.id),
                               workspace=BranchWorkspace(self.engine, session.id, turn.branch_id, turn.id),
                               result_budget_chars=self.settings.tool_result_budget_chars),
                           tool_budget_chars=self.settings.tool_result_budget_chars, hints=self.hints,
                           force_tool=bool(options.get("force_tool")), tool_choice=options.get("tool_choice"),
                           history_len=options.get("history_len", 0))

    def _launch(self, handle: TurnHandle, graph_input: Any, context: TurnContext, config: dict) -> None:
        task = asyncio.get_running_loop().create_task(self._drive(handle, graph_input, context, config))
        handle.task = task
        self._tasks.add(task)
        self._live[handle.turn_id] = handle
        self.cancels.ensure_running()
        task.add_done_callback(self._tasks.discard)

    async def _drive(self, handle: TurnHandle, graph_input: Any, context: TurnContext, config: dict) -> None:
        try:
            if await self._run_graph(handle, graph_input, context, config):
                await self.hints.turn_ended(context.cache_session)
        finally:
            if self._live.get(handle.turn_id) is handle:
                del self._live[handle.turn_id]
            handle.close()
            if handle.journal is not None:  # written before the task ends (and before shutdown closes the database)
                await handle.journal.wait_written()

    async def _run_graph(self, handle: TurnHandle, graph_input: Any, context: TurnContext, config: dict) -> bool:
        """Run the graph from `config`, emit its events and record the outcome; False when it
        waits for the operator."""
        emit = handle.emit
        try:
            interrupts: list[Any] = []
            handle.phase = "graph"  # from here on a cancel request cancels this task
            if handle.cancel_requested:
                raise asyncio.CancelledError
            async for mode, chunk in self.graph.astream(graph_input, config, context=context,
                                                        stream_mode=["custom", "updates"]):
                if mode == "custom":
                    emit(chunk)
                elif isinstance(chunk, dict) and "__interrupt__" in chunk:
                    interrupts.extend(chunk["__interrupt__"])
            handle.phase = "finishing"  # the outcome is recorded as it is, even if asked to stop now
            if interrupts:
                emit(await asyncio.to_thread(self._pause, context, interrupts[0].value))
                return False
            # The thread's latest checkpoint: this run's last (its branch is busy meanwhile).
            state = await self.graph.aget_state(branch_threads.thread_config(config["configurable"]["thread_id"]))
            emit(await asyncio.to_thread(self._complete, context, state.values, branch_threads.checkpoint_id_of(state)))
        except ModelBackendError as exc:
            emit(await asyncio.to_thread(self._fail, context, str(exc), f"model_backend_{exc.kind}", True))
        except asyncio.CancelledError:
            if handle.cancel_requested and handle.phase == "graph":
                # The user stopped it (cancel_turn): the graph and its model request are closed.
                # Handled here, so the awaits that follow (the record, the done hint) run normally.
                asyncio.current_task().uncancel()
                emit(await asyncio.to_thread(self._cancelled, context))
                return True
            # synchronously: the workbench is stopping, and an await here could be cancelled too
            self._fail(context, "the workbench stopped while this turn was running", "cancelled", retryable=True)
            raise
        except Exception as exc:  # keep the process up and the session usable
            log.exception("turn %s failed", context.turn_id)
            emit(await asyncio.to_thread(self._fail, context, f"internal error: {type(exc).__name__}: {exc}",
                                         "internal_error", True))
        return True

    def _pause(self, context: TurnContext, request: dict) -> dict:
        with Session(self.engine) as db:
            approval = db.exec(select(Approval).where(Approval.run_id == context.run_id,
                                                      Approval.tool_call_id == request["tool_call_id"])).first()
            if approval is None:
                approval = Approval(session_id=context.session_id, branch_id=context.branch_id,
                                    turn_id=context.turn_id, run_id=context.run_id,
                                    tool_call_id=request["tool_call_id"], tool_name=request["tool_name"],
                                    arguments=request.get("arguments"))
                db.add(approval)
            turn, run = db.get(Turn, context.turn_id), db.get(Run, context.run_id)
            turn.status = run.status = "awaiting_approval"
            db.add(turn)
            db.add(run)
            db.commit()
            db.refresh(approval)
            return {"type": "approval_request", "approval_id": approval.id, "turn_id": context.turn_id,
                    "tool_call_id": approval.tool_call_id, "tool_name": approval.tool_name,
                    "arguments": approval.arguments}

    def _complete(self, context: TurnContext, values: dict, end_checkpoint_id: str) -> dict:
        with Session(self.engine) as db:
            turn, run = db.get(Turn, context.turn_id), db.get(Run, context.run_id)
            start = (run.options or {}).get("history_len", 0)
            turn.messages = branch_threads.openai_messages(values["messages"][start:])
            turn.end_checkpoint_id = end_checkpoint_id
            turn.final_answer = values.get("final_answer") or ""
            turn.outcome = values.get("outcome")
            turn.status = run.status = "completed"
            turn.finished_at = run.ended_at = utcnow()
            branch = db.get(Branch, turn.branch_id)
            branch.head_turn_id = turn.id
            for row in (turn, run, branch):
                db.add(row)
            workspace.publish(db, turn)  # its files appear with its completion, in one commit
            db.commit()
            return {"type": "final", "turn_id": turn.id, "branch_id": turn.branch_id, "content": turn.final_answer,
                    "outcome": turn.outcome, "steps": values.get("steps", 0)}

    def _fail(self, context: TurnContext, message: str, error_type: str, retryable: bool) -> dict:
        self._end_unfinished(context, "failed", message)
        return {"type": "error", "turn_id": context.turn_id, "message": message, "error_type": error_type,
                "retryable": retryable}

    def _cancelled(self, context: TurnContext) -> dict:
        self._end_unfinished(context, "cancelled", CANCELLED)
        return {"type": "cancelled", "turn_id": context.turn_id, "message": CANCELLED}

    def _end_unfinished(self, context: TurnContext, status: str, message: str) -> None:
        """Record a turn (and its run) that ended without an outcome: failed or cancelled; the
        files it staged go with it (app/services/workspace.py)."""
        with Session(self.engine) as db:
            turn, run = db.get(Turn, context.turn_id), db.get(Run, context.run_id)
            turn.status = run.status = status
            turn.error = run.error = message
            turn.finished_at = run.ended_at = utcnow()
            db.add(turn)
            db.add(run)
            workspace.discard(db, turn)
            db.commit()

    def turn_public(self, turn_id: str) -> TurnPublic:
        with Session(self.engine) as db:
            return TurnPublic.model_validate(sessions_service.get_turn(db, turn_id))


def _turn_start(db: Session, branch: Branch, head: Turn | None) -> TurnStart:
    """Where the next turn of `branch` (head turn `head`) starts: the end of its head turn when
    that turn ran on this branch, else (nothing run here yet) the branch's base. Where neither
    checkpoint exists (a new branch, turns recorded before checkpoints were, a lost checkpoint
    store) the history the turn tree records seeds the thread."""
    thread_id = branch_thread_id(branch.id)
    own_head = head is not None and head.branch_id == branch.id
    checkpoint_id = head.end_checkpoint_id if own_head else branch.base_checkpoint_id
    seed = sessions_service.history(db, branch)
    if own_head or branch.fork_turn_id in (None, branch.head_turn_id):
        return TurnStart(thread_id, checkpoint_id, seed, is_base=not own_head)
    cut = sessions_service.get_turn(db, branch.fork_turn_id)  # forked inside it (its head is cut's parent)
    return TurnStart(thread_id, checkpoint_id, seed, is_base=True, cut=cut,
                     cut_history_len=sessions_service.turn_history_len(db, cut))


def _check_tool_choice(choice: Any, scenario: Any) -> None:
    if isinstance(choice, str):
        if choice not in ("auto", "required", "none"):
            raise WorkbenchError(f"tool_choice must be auto, required, none or a function object, got {choice!r}",
                                 "invalid_tool_choice", 422)
        return
    name = ((choice or {}).get("function") or {}).get("name") if isinstance(choice, dict) else None
    if choice.get("type") != "function" or not name:
        raise WorkbenchError('tool_choice object must be {"type": "function", "function": {"name": ...}}',
                             "invalid_tool_choice", 422)
    known = [t.name for t in scenario.tools]
    if name not in known:
        raise WorkbenchError(f"tool_choice names unknown tool {name!r}; known: {', '.join(known)}",
                             "invalid_tool_choice", 422)


def _branch_busy(branch_id: str, busy: Turn) -> Conflict:
    return Conflict(f"branch {branch_id!r} already has a turn that is {busy.status} ({busy.id}); "
                    "wait for it, answer its approval, or fork a new branch", "branch_busy")
