"""Running turns: validate, record, drive the agent graph, stream its events.

A turn runs as a background task that appends events to its log (app/services/turn_log.py);
the HTTP response (SSE or a collected JSON answer) reads that log, and so can any later reader
(`GET /api/turns/{id}/events`: replay, then follow). The run therefore finishes and is
recorded even when the client disconnects. `cancel` stops it: the task is cancelled inside
the graph, which closes the model request (the server frees its slot), the turn and run are
marked `cancelled` and nothing else moves: the branch head stays at its last completed turn,
whose end checkpoint the next turn starts from.

The events (a dict each, with "type") are listed in app/services/turn_log.py. Each branch is
one LangGraph thread; where on it a turn starts is app/services/turn_start.py; what a retry and a
continue run again is app/services/turn_requests.py; how a turn's status moves (and what each
move records) is app/services/turn_records.py.

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
from dataclasses import replace
from functools import partial
from typing import Any

from langgraph.types import Command
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from app.agent.cache_hints import CacheHints, hint_key
from app.agent.context import TurnContext
from app.agent.context_budget import ContextBudget
from app.agent.context_state import ContextState
from app.agent.model_client import ModelAdapter, ModelBackendError
from app.db.models import AgentSession, Branch, Run, RunOptions, Turn, TurnCreate, TurnPublic, TurnStatus
from app.errors import Conflict
from app.scenario_catalog import ScenarioCatalog
from app.services import branch_threads, turn_records
from app.services import sessions as sessions_service
from app.services.remote_cancel import CancelWatcher, wait_ended
from app.services.traces import session_artifact_text
from app.services.turn_journal import TurnJournal, segment_of
from app.services.turn_log import TurnHandle
from app.services.turn_replay import FollowTiming, RecordedTurn
from app.services.turn_requests import branch_busy, check_tool_choice, continue_request, retry_request, validate_message
from app.services.turn_start import TurnStart, branch_start, next_conversation, open_start, turn_start
from app.services.workspace import BranchWorkspace
from app.settings import WorkbenchSettings
from app.tracing import TraceRecorder
from tools.base import ToolContext

log = logging.getLogger(__name__)

CANCELLED = "stopped by the user; the branch continues from its last completed turn"
CANCEL_WAIT_S = 30.0  # how long a cancel passed to another process waits for the turn to end


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
        return validate_message(message, self.settings.max_message_chars)

    async def start_turn(self, session_id: str, request: TurnCreate, retry_of: str | None = None) -> TurnHandle:
        """Validate and record a new turn, then run it in the background (`retry_of`: the
        failed turn it runs again, recorded in the run's options and the first event)."""
        handle, first, graph_input, context, start = await asyncio.to_thread(
            self._record_turn, session_id, request, retry_of)
        try:
            checkpoint_id, history_len = await open_start(self.graph, start)
            await asyncio.to_thread(self._record_start, context, start, checkpoint_id, history_len)
        except Exception as exc:  # the turn is recorded `running`: it must not stay so
            await asyncio.to_thread(self._fail, context, f"the turn could not start: {exc}", "start_failed", True)
            raise
        context.history_len = history_len
        handle.emit(first)  # here, on the loop: the log wakes its readers with asyncio events
        self._launch(handle, graph_input, context, self._run_config(start.thread_id, checkpoint_id, context))
        return handle

    def _record_turn(self, session_id: str, request: TurnCreate,
                     retry_of: str | None) -> tuple[TurnHandle, dict, dict | None, TurnContext, TurnStart]:
        message = self.validate_message(request.message)
        with self._record_lock, Session(self.engine) as db:
            session = sessions_service.get_session(db, session_id)
            scenario = self.catalog.get(session.scenario)
            branch = turn_records.lock_branch(db, sessions_service.get_branch(db, session, request.branch_id))
            if request.tool_choice is not None:
                check_tool_choice(request.tool_choice, scenario)
            busy = sessions_service.busy_turn(db, branch)
            if busy is not None:
                raise branch_busy(branch.id, busy)
            # Read after the check: a turn that was busy a moment ago recorded its end and the
            # branch's head at once, so the head read now is at least that turn's.
            db.refresh(branch)
            parent = db.get(Turn, branch.head_turn_id) if branch.head_turn_id else None
            start = turn_start(db, branch, parent)
            if start.cut is not None and message != start.cut.user_message:
                raise Conflict(f"branch {branch.id!r} was forked inside turn {start.cut.id!r}: its first turn "
                               "continues that turn (POST .../branches/{id}/continue)", "branch_continues_turn")
            options = RunOptions(force_tool=request.force_tool, tool_choice=request.tool_choice, retry_of=retry_of)
            try:
                turn, run = turn_records.begin(db, session_id=session.id, branch=branch, parent=parent,
                                               message=message, thread_id=start.thread_id, owner=self.owner,
                                               options=options)
            except IntegrityError:
                db.rollback()  # another workbench process started a turn on the branch just now
                busy = sessions_service.busy_turn(db, branch)
                if busy is None:
                    raise
                raise branch_busy(branch.id, busy) from None
            db.commit()
            handle = TurnHandle(turn.id, run.id, journal=self._journal(turn, segment=0))
            first = _turn_event(turn, run, resumed=False)
            context = self._context(session, turn, run, scenario)
        return handle, first, start.graph_input(message, self.settings.step_budget), context, start

    def _record_start(self, context: TurnContext, start: TurnStart, checkpoint_id: str, history_len: int) -> None:
        self._record(turn_records.record_start, context, checkpoint_id, history_len,
                     start.is_base and checkpoint_id != start.checkpoint_id)  # a new base: retries start there too

    @staticmethod
    def _run_config(thread_id: str, checkpoint_id: str | None, context: TurnContext) -> dict:
        # The turn's ids go into each checkpoint's metadata: the checkpoint list shows them.
        return branch_threads.thread_config(thread_id, checkpoint_id, turn_id=context.turn_id,
                                            branch_id=context.branch_id)

    async def retry_turn(self, turn_id: str) -> TurnHandle:
        """Run a failed turn's message again (same options) as a new turn on its branch
        (409 unless it can: turn_start.retry_request)."""
        session_id, request = await asyncio.to_thread(self._in_session, retry_request, turn_id)
        return await self.start_turn(session_id, request, retry_of=turn_id)

    async def continue_branch(self, session_id: str, branch_id: str) -> TurnHandle:
        """Run the first turn of a branch forked inside a turn: that turn's message, continued
        from the fork's checkpoint (409 for a branch not forked so, or already continued)."""
        request = await asyncio.to_thread(self._in_session, continue_request, session_id, branch_id)
        return await self.start_turn(session_id, request)

    def _in_session(self, read: Callable[..., Any], *args: Any) -> Any:
        with Session(self.engine) as db:
            return read(db, *args)

    async def conversation(self, session_id: str, branch_id: str | None) -> tuple[Branch, list[dict]]:
        """The branch (`branch_id`, or the session's active one) and the conversation its next
        turn starts from (OpenAI messages, no system prompt), read from its thread."""
        branch, messages, _ = await self.next_start(session_id, branch_id)
        return branch, messages

    async def next_start(self, session_id: str, branch_id: str | None) -> tuple[Branch, list[dict], ContextState]:
        """`conversation`, with the branch's context state there (its compaction level, its
        estimate: what the next turn's first model call fits the context from)."""
        branch, start = await asyncio.to_thread(self._branch_start, session_id, branch_id)
        return branch, *await next_conversation(self.graph, start)

    def _branch_start(self, session_id: str, branch_id: str | None) -> tuple[Branch, TurnStart]:
        with Session(self.engine) as db:
            branch = sessions_service.get_branch(db, sessions_service.get_session(db, session_id), branch_id)
            return branch, branch_start(db, branch)

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
            turn, run = turn_records.decide(db, approval_id, approved, comment, decided_by)
            session = sessions_service.get_session(db, turn.session_id)
            scenario = self.catalog.get(session.scenario)
            turn_records.resume(db, turn, run, self.owner)  # the process resuming it runs it now
            segment = segment_of(db, turn.id)  # counts the decision just claimed
            db.commit()
            handle = TurnHandle(turn.id, run.id, journal=self._journal(turn, segment))
            first = _turn_event(turn, run, resumed=True)
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
        then answers the turn as it stands); one whose process died is ended here. A running
        turn that pauses for an approval as it is asked to stop (it was recording the pause)
        is cancelled in its pause. Conflict (`turn_not_running`) for a turn that had already
        ended, and (`turn_starting`) for one this process is still recording."""
        handle = self._live.get(turn_id)
        if handle is not None:
            handle.request_cancel()
            assert handle.task is not None  # set before the handle is registered as live (_launch)
            await asyncio.wait({handle.task})  # not cancelled with this request: the turn ends regardless
        else:
            session_key = await asyncio.to_thread(self._cancel_recorded, turn_id)
            if session_key is not None:
                await self.hints.turn_ended(session_key)
                return await asyncio.to_thread(self.turn_public, turn_id)
            await wait_ended(self.engine, turn_id, self.follow_timing.poll_s, CANCEL_WAIT_S)  # passed on
        session_key = await asyncio.to_thread(self._cancel_paused, turn_id)
        if session_key is not None:
            await self.hints.turn_ended(session_key)
        return await asyncio.to_thread(self.turn_public, turn_id)

    def _cancel_recorded(self, turn_id: str) -> str | None:
        """Cancel a turn no task of this process runs: ask its running process (None), or end it
        here (a paused turn, or one whose process died) and return its cache session key."""
        with self._record_lock, Session(self.engine) as db:
            turn = turn_records.lock_turn(db, turn_id)  # a decision or a cancel elsewhere goes first, or after
            if turn.status == TurnStatus.RUNNING:
                run = sessions_service.latest_run(db, turn.id)
                owner = run.owner if run else None
                if owner is not None and owner == self.owner:
                    raise Conflict(f"turn {turn_id!r} is just starting; try again in a moment", "turn_starting")
                if run is not None and owner is not None and self.alive(owner):
                    turn_records.request_cancel(db, run)
                    db.commit()
                    return None
            elif turn.status != TurnStatus.AWAITING_APPROVAL:
                raise Conflict(f"turn {turn_id!r} is {turn.status}; only a running turn can be stopped",
                               "turn_not_running")
            turn_records.cancel_here(db, turn, CANCELLED)  # paused, or its process is dead: it ends here
            db.commit()
            return hint_key(turn.session_id, turn.branch_id)

    def _cancel_paused(self, turn_id: str) -> str | None:
        """Cancel turn `turn_id` if it waits for an approval (its cache session key); None for a
        turn in any other state, which is left as it is."""
        with self._record_lock, Session(self.engine) as db:
            turn = turn_records.lock_turn(db, turn_id)
            if turn.status != TurnStatus.AWAITING_APPROVAL:
                return None
            turn_records.cancel_here(db, turn, CANCELLED)
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
        options = RunOptions.of(run)
        recorder = TraceRecorder(self.engine, session_id=session.id, branch_id=turn.branch_id, turn_id=turn.id,
                                 run_id=run.id, base_url=self.settings.llm_base_url)
        return TurnContext(session_id=session.id, branch_id=turn.branch_id, turn_id=turn.id, run_id=run.id,
                           scenario=scenario, adapter=self.adapter, budget=self.budget, recorder=recorder,
                           tool_context=replace(self.tool_context, artifact_reader=partial(
                               session_artifact_text, self.engine, session.id),
                               workspace=BranchWorkspace(self.engine, session.id, turn.branch_id, turn.id),
                               result_budget_chars=self.settings.tool_result_budget_chars),
                           tool_budget_chars=self.settings.tool_result_budget_chars, hints=self.hints,
                           force_tool=options.force_tool, tool_choice=options.tool_choice,
                           history_len=options.history_len or 0,
                           compact_tool_schemas=self.settings.compact_tool_schemas)

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
            handle.close()
            try:
                if handle.journal is not None:  # written before the task ends (and before shutdown closes the database)
                    await handle.journal.wait_written()
            finally:
                # Live until its journal is written: a cancel meanwhile waits for this task, then
                # reads how the turn ended, instead of writing after rows still on their way.
                if self._live.get(handle.turn_id) is handle:
                    del self._live[handle.turn_id]

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
                if handle.journal is not None:  # what it streamed first, then the pause with its event
                    await handle.journal.settle()
                emit(await asyncio.to_thread(self._pause, context, interrupts[0].value), journal=False)
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
                current = asyncio.current_task()
                assert current is not None  # this runs in the turn's task
                current.uncancel()
                handle.phase = "finishing"  # recording it: nothing cancels this task again
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
        return self._record(turn_records.pause, context, request)

    def _complete(self, context: TurnContext, values: dict, end_checkpoint_id: str) -> dict:
        return self._record(turn_records.complete, context, values, end_checkpoint_id)  # with its files

    def _fail(self, context: TurnContext, message: str, error_type: str, retryable: bool) -> dict:
        self._record(turn_records.fail, context, message)
        return {"type": "error", "turn_id": context.turn_id, "message": message, "error_type": error_type,
                "retryable": retryable}

    def _cancelled(self, context: TurnContext) -> dict:
        self._record(turn_records.cancel, context, CANCELLED)
        return {"type": "cancelled", "turn_id": context.turn_id, "message": CANCELLED}

    def _record(self, transition: Callable[..., Any], context: TurnContext, *args: Any) -> Any:
        """Move the turn and run of `context` by `transition` (app/services/turn_records.py), committed."""
        with Session(self.engine) as db:
            turn = turn_records.lock_turn(db, context.turn_id)  # before its run: the one lock order
            result = transition(db, turn, db.get(Run, context.run_id), *args)
            db.commit()
            return result

    def turn_public(self, turn_id: str) -> TurnPublic:
        with Session(self.engine) as db:
            return TurnPublic.model_validate(sessions_service.get_turn(db, turn_id))


def _turn_event(turn: Turn, run: Run, resumed: bool) -> dict:
    """The first event of a turn's stream (or of its resumed segment)."""
    return {"type": "turn", "turn_id": turn.id, "run_id": run.id, "session_id": turn.session_id,
            "branch_id": turn.branch_id, "parent_turn_id": turn.parent_turn_id, "resumed": resumed,
            "retry_of": RunOptions.of(run).retry_of}
