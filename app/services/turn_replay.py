"""The events of a turn that no task of this process is running, read from the database.

A turn this process runs is followed through its live log (app/services/turn_log.py). Any
other turn, whether another workbench process on the same database runs it, it ended, or it
waits for an approval, is followed through its journal (app/services/turn_journal.py):
`RecordedTurn.events()` replays the rows of the turn's current segment, then polls for the
rows that follow, until a terminal event. The running process writes its journal every few
tenths of a second, so a follower elsewhere sees the stream in batches, tokens merged.

What the journal lacks is rebuilt from the turn's own rows: a turn recorded before the
journal existed, or whose journal writes failed, gets its first event (`turn`) and its
terminal one (`final`, `error`, `cancelled`, or the `approval_request` it waits on); its
steps are in the turn itself (`GET /api/turns/{id}`: messages) and its trace. A turn whose
running process died (its liveness lock is free: app/services/liveness.py) ends its stream
with an `error` event saying so; a Stop ends it at once (app/services/remote_cancel.py), and
otherwise the next process to start marks it failed (app/services/recovery.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from app.db.models import Approval, ApprovalStatus, Run, RunOptions, Turn, TurnStatus
from app.errors import NotFound
from app.services.sessions import latest_run
from app.services.turn_journal import TERMINAL_EVENTS, read_events, segment_of

PROCESS_LOST = ("the workbench process running this turn stopped; stop the turn to free its branch now (or the "
                "next workbench to start marks it failed); either way it can then be retried")


@dataclass(frozen=True)
class FollowTiming:
    """How a follower polls: every `poll_s`; the running process's liveness every `liveness_s`;
    and for a turn recorded as ended, up to `grace_s` for its terminal row to be written."""

    poll_s: float = 0.25
    liveness_s: float = 2.0
    grace_s: float = 3.0


@dataclass
class _Look:
    """One read of the database: the new rows, and the turn's state."""

    rows: list[dict]
    last_seq: int
    owner: str | None
    first: dict
    terminal: dict | None  # rebuilt from the turn's rows, when it has ended or waits
    ended_age_s: float  # how long ago it ended or paused, as its rows say (0 when they do not)


class RecordedTurn:
    """A turn followed from the database; reads like a TurnHandle (`events`, `collect`)."""

    def __init__(self, engine: Engine, turn_id: str, alive: Callable[[str | None], bool],
                 timing: FollowTiming = FollowTiming()) -> None:
        self.engine, self.turn_id, self.alive, self.timing = engine, turn_id, alive, timing
        self.segment = 0

    def open(self) -> RecordedTurn:
        """Check that the turn exists (NotFound otherwise) and fix the segment to follow."""
        with Session(self.engine) as db:
            if db.get(Turn, self.turn_id) is None:
                raise NotFound(f"unknown turn {self.turn_id!r}", "unknown_turn")
            self.segment = segment_of(db, self.turn_id)
        return self

    async def collect(self) -> list[dict]:
        return [event async for event in self.events()]

    async def events(self, start: int = 0) -> AsyncIterator[dict]:
        """The segment's events from the journal, then those that follow, until a terminal one."""
        after, told = -1, 0
        ended_since: float | None = None
        next_liveness = time.monotonic() + self.timing.liveness_s
        while True:
            look = await asyncio.to_thread(self._look, after)
            if look is None:  # too late for a 404: the stream has begun
                yield {"type": "error", "turn_id": self.turn_id, "message": f"turn {self.turn_id!r} was deleted",
                       "error_type": "unknown_turn", "retryable": False}
                return
            after = look.last_seq
            for i, event in enumerate(look.rows):
                if told >= start:
                    yield event
                told += 1
                # a pause ends the stream, unless a row follows it (the paused turn was cancelled)
                if event.get("type") in TERMINAL_EVENTS and (event["type"] != "approval_request"
                                                             or i == len(look.rows) - 1):
                    return
            now = time.monotonic()
            if look.terminal is not None:  # ended (or paused): its terminal row may still be on its way
                ended_since = ended_since if ended_since is not None else now - look.ended_age_s
                if now - ended_since >= self.timing.grace_s:
                    for event in ([look.first] if told == 0 else []) + [look.terminal]:
                        if told >= start:
                            yield event
                        told += 1
                    return
            elif now >= next_liveness:
                next_liveness = now + self.timing.liveness_s
                if not await asyncio.to_thread(self.alive, look.owner):
                    if told == 0:
                        yield look.first
                    yield {"type": "error", "turn_id": self.turn_id, "message": PROCESS_LOST,
                           "error_type": "process_lost", "retryable": True}
                    return
            await asyncio.sleep(self.timing.poll_s)

    def _look(self, after: int) -> _Look | None:
        """None: the turn is gone (its session or branch was deleted meanwhile)."""
        with Session(self.engine) as db:
            turn = db.get(Turn, self.turn_id)
            if turn is None:
                return None
            rows = read_events(db, self.turn_id, self.segment, after)
            run = latest_run(db, turn.id)
            terminal = _terminal(db, turn) if turn.status != TurnStatus.RUNNING else None
            return _Look(rows=[r.payload for r in rows], last_seq=rows[-1].seq if rows else after,
                         owner=run.owner if run else None, first=_first(turn, run),
                         terminal=terminal, ended_age_s=_age_s(turn.finished_at or (run.ended_at if run else None)))


def _age_s(moment: datetime | None) -> float:
    if moment is None:
        return 0.0
    if moment.tzinfo is None:  # SQLite gives naive datetimes back; they were written in UTC
        moment = moment.replace(tzinfo=UTC)
    return max(0.0, (datetime.now(UTC) - moment).total_seconds())


def _first(turn: Turn, run: Run | None) -> dict:
    return {"type": "turn", "turn_id": turn.id, "run_id": run.id if run else None, "session_id": turn.session_id,
            "branch_id": turn.branch_id, "parent_turn_id": turn.parent_turn_id, "resumed": False,
            "retry_of": RunOptions.of(run).retry_of, "replayed": True}


def _terminal(db: Session, turn: Turn) -> dict:
    if turn.status == TurnStatus.COMPLETED:
        steps = sum(1 for m in turn.messages or [] if m.get("role") == "assistant")
        return {"type": "final", "turn_id": turn.id, "branch_id": turn.branch_id, "content": turn.final_answer or "",
                "outcome": turn.outcome, "steps": steps}
    if turn.status == TurnStatus.CANCELLED:
        return {"type": "cancelled", "turn_id": turn.id, "message": turn.error or "stopped by the user"}
    if turn.status == TurnStatus.AWAITING_APPROVAL:
        approval = db.exec(select(Approval)
                           .where(Approval.turn_id == turn.id, Approval.status == ApprovalStatus.PENDING)
                           .order_by(col(Approval.created_at))).first()
        if approval is not None:
            return {"type": "approval_request", "approval_id": approval.id, "turn_id": turn.id,
                    "tool_call_id": approval.tool_call_id, "tool_name": approval.tool_name,
                    "arguments": approval.arguments}
    return {"type": "error", "turn_id": turn.id, "message": turn.error or f"the turn is {turn.status}",
            "error_type": "failed", "retryable": turn.status == TurnStatus.FAILED}
