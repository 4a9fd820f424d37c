"""A turn's events written to the database as it streams them: the journal any workbench
process reads to replay and follow a turn (app/services/turn_replay.py).

The process running a turn keeps its events in memory (app/services/turn_log.py) for its own
readers; the journal copies them to `turn_events` rows in batches, from a worker thread, so a
turn never waits on the database to stream: events gather for `flush_s` (a few tenths of a
second), consecutive tokens are merged into one row, and the batch is written in one
transaction. A terminal event (final, error, cancelled, approval_request) is written at once.
A failed write is logged and the batch dropped: the turn goes on, and a reader who misses
the terminal row rebuilds it from the turn's own row (app/services/turn_replay.py).

Segments: a turn paused for an approval and resumed streams again from a new `turn` event.
Its segment number is the number of its approvals decided so far (`segment_of`), which both
the process resuming it and any reader compute from the same rows, without asking each other.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import Session, col, func, select

from app.db.models import Approval, Turn, TurnEvent

log = logging.getLogger(__name__)

TERMINAL_EVENTS = ("final", "error", "approval_request", "cancelled")
DECIDED = ("approved", "rejected")


def segment_of(db: Session, turn_id: str) -> int:
    """The segment a turn streams now (or streamed last): how many of its approvals were decided."""
    return db.exec(select(func.count()).select_from(Approval)
                   .where(Approval.turn_id == turn_id, col(Approval.status).in_(DECIDED))).one()


def merged_tokens(events: list[dict]) -> list[dict]:
    """`events` with each run of consecutive `token` events joined into one (the text is the same)."""
    out: list[dict] = []
    def plain_token(event: dict) -> bool:
        return event.get("type") == "token" and set(event) == {"type", "text"}

    for event in events:
        if out and plain_token(event) and plain_token(out[-1]):
            out[-1] = {"type": "token", "text": out[-1]["text"] + event["text"]}
        else:
            out.append(event)
    return out


def read_events(db: Session, turn_id: str, segment: int, after_seq: int = -1) -> list[TurnEvent]:
    """The rows of `turn_id`'s `segment` with seq > `after_seq`, in order."""
    return list(db.exec(select(TurnEvent).where(TurnEvent.turn_id == turn_id, TurnEvent.segment == segment,
                                                TurnEvent.seq > after_seq).order_by(col(TurnEvent.seq))).all())


def append_event(db: Session, turn: Turn, event: dict) -> None:
    """Add `event` after the last row of `turn`'s current segment, in the caller's transaction:
    for an event no running task emits (a paused turn cancelled), written with the change it
    tells of, so a reader who sees the turn's new status also sees its event."""
    segment = segment_of(db, turn.id)
    last = db.exec(select(func.max(TurnEvent.seq)).where(TurnEvent.turn_id == turn.id,
                                                          TurnEvent.segment == segment)).one()
    db.add(TurnEvent(session_id=turn.session_id, branch_id=turn.branch_id, turn_id=turn.id, segment=segment,
                     seq=0 if last is None else last + 1, type=str(event["type"]), payload=event))


class TurnJournal:
    """Writes one segment of a turn's events. `add` and `close` run on the event loop; the
    rows are written by a task of this journal through worker threads, one batch at a time,
    in the order the events were added."""

    def __init__(self, engine: Engine, *, session_id: str, branch_id: str, turn_id: str, segment: int,
                 flush_s: float) -> None:
        self.engine, self.flush_s = engine, flush_s
        self.ids: dict[str, Any] = {"session_id": session_id, "branch_id": branch_id, "turn_id": turn_id,
                                    "segment": segment}
        self._pending: list[dict] = []
        self._added = self._written = 0  # events added, and of those written (or dropped with a failed write)
        self._progress = asyncio.Event()  # set (and replaced) after each write
        self._next_seq = 0
        self._closing = False
        self._more = asyncio.Event()
        self._urgent = asyncio.Event()
        self._task: asyncio.Task | None = None

    def add(self, event: dict) -> None:
        self._pending.append(event)
        self._added += 1
        if event.get("type") in TERMINAL_EVENTS:
            self._urgent.set()
        self._more.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._write_loop())

    def close(self) -> None:
        """No event follows: what is pending is written now, then the task ends."""
        self._closing = True
        self._urgent.set()
        self._more.set()

    async def settle(self) -> None:
        """Write what was added so far now, and wait until it is written: a row written next
        by someone else (`append_event`) then comes after it."""
        target = self._added
        while self._task is not None and not self._task.done() and self._written < target:
            progress = self._progress
            self._urgent.set()
            self._more.set()
            await progress.wait()

    async def wait_written(self) -> None:
        """Wait until the task has written everything added before `close`."""
        if self._task is not None:
            await asyncio.shield(self._task)

    async def _write_loop(self) -> None:
        while True:
            await self._more.wait()
            if not self._urgent.is_set():  # gather a batch; a terminal event or close cuts it short
                try:
                    await asyncio.wait_for(self._urgent.wait(), self.flush_s)
                except TimeoutError:
                    pass
            self._more.clear()
            self._urgent.clear()
            taken, self._pending = self._pending, []
            batch = merged_tokens(taken)
            if batch:
                first, self._next_seq = self._next_seq, self._next_seq + len(batch)
                await asyncio.to_thread(self._write, batch, first)
            self._written += len(taken)
            progress, self._progress = self._progress, asyncio.Event()
            progress.set()
            if self._closing and not self._pending:
                return

    def _write(self, batch: list[dict], first_seq: int) -> None:
        try:
            with Session(self.engine) as db:
                for i, event in enumerate(batch):
                    db.add(TurnEvent(**self.ids, seq=first_seq + i, type=str(event.get("type")), payload=event))
                db.commit()
        except Exception:  # the turn goes on; readers rebuild the terminal event
            log.exception("turn %s: could not write %d journal event(s)", self.ids["turn_id"], len(batch))
