"""Stopping a turn that another workbench process runs.

Only the process running a turn can cancel its task (and so close its model request). A
cancel that reaches another process (a load balancer sent the Stop there) is passed on
through the database: it stamps the run's `cancel_requested_at` (app/services/turn_records.py,
`request_cancel`), and the running process, which looks for such stamps on its own running
turns every few tenths of a second while it runs any (`CancelWatcher`), cancels the turn
exactly as a local cancel would. The process that took the request waits for the turn to end
and answers how it ended.

A turn whose running process is dead (its liveness lock is free: app/services/liveness.py)
has nobody to stop it: the cancel ends it in the database at once (`cancelled`), which also
frees its branch without waiting for a workbench to restart.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Protocol

from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from app.db.models import Run, Turn, TurnStatus

log = logging.getLogger(__name__)


class Cancellable(Protocol):
    cancel_requested: bool

    def request_cancel(self) -> None: ...


def requested_turns(engine: Engine, owner: str, turn_ids: list[str]) -> list[str]:
    """Which of `turn_ids` (running here, as `owner`) another process asked to cancel."""
    with Session(engine) as db:
        return list(db.exec(select(Run.turn_id).where(Run.owner == owner, Run.status == TurnStatus.RUNNING,
                                                      col(Run.turn_id).in_(turn_ids),
                                                      col(Run.cancel_requested_at).is_not(None))).all())


async def wait_ended(engine: Engine, turn_id: str, poll_s: float, timeout_s: float) -> None:
    """Wait until turn `turn_id` is no longer `running` (at most `timeout_s`)."""
    def status() -> str | None:
        with Session(engine) as db:
            turn = db.get(Turn, turn_id)
            return turn.status if turn else None

    deadline = asyncio.get_running_loop().time() + timeout_s
    while await asyncio.to_thread(status) == TurnStatus.RUNNING and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(poll_s)


class CancelWatcher:
    """In the process running turns: while it runs any (`live`, turn id → handle), reads the
    cancel requests other processes left for them every `poll_s`, and cancels those turns."""

    def __init__(self, engine: Engine, owner: str | None, live: Mapping[str, Cancellable], poll_s: float) -> None:
        """`owner` None: nothing to watch (no other process can ask); `ensure_running` does nothing."""
        self.engine, self.owner, self.live, self.poll_s = engine, owner, live, poll_s
        self._task: asyncio.Task | None = None

    def ensure_running(self) -> None:
        """Start watching (a turn was launched); the watch ends by itself once no turn runs."""
        if self.owner is not None and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._watch())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _watch(self) -> None:
        assert self.owner is not None  # ensure_running starts the watch only with an owner
        while self.live:
            await asyncio.sleep(self.poll_s)
            waiting = [turn_id for turn_id, handle in list(self.live.items()) if not handle.cancel_requested]
            if not waiting:
                continue
            try:
                asked = await asyncio.to_thread(requested_turns, self.engine, self.owner, waiting)
            except Exception:  # a database hiccup must not end the watch
                log.exception("could not read cancel requests")
                continue
            for turn_id in asked:
                handle = self.live.get(turn_id)
                if handle is not None:
                    log.info("turn %s: cancelled at the request of another workbench process", turn_id)
                    handle.request_cancel()

