"""Cancel requests passed between workbench processes through the database
(app/services/remote_cancel.py), on SQLite and PostgreSQL; tests/app/test_multi_process.py
runs them between two real processes."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from sqlmodel import Session

from app.db.engine import make_engine
from app.db.models import Run, Turn
from app.services import sessions as sessions_service
from app.services.remote_cancel import CancelWatcher, requested_turns
from app.services.turn_records import request_cancel as stamp_request
from tests.app.support import make_settings

pytestmark = [pytest.mark.usefixtures("workbench_database"), pytest.mark.timeout(60)]


@pytest.fixture
def engine(tmp_path):
    engine = make_engine(make_settings(tmp_path, "http://127.0.0.1:9/v1").database_url)
    yield engine
    engine.dispose()


def _run(engine, owner: str, status: str = "running", stamped: bool = False) -> str:
    """A turn with one run of `owner`; returns the turn id."""
    with Session(engine) as db:
        session = sessions_service.create_session(db, "lab")
        turn = Turn(session_id=session.id, branch_id=session.active_branch_id, user_message="hi", status=status)
        db.add(turn)
        db.flush()
        run = Run(session_id=session.id, branch_id=turn.branch_id, turn_id=turn.id, thread_id="t", owner=owner,
                  status=status)
        if stamped:
            stamp_request(db, run)
        db.add(run)
        db.commit()
        return turn.id


def _stamp(engine, turn_id: str) -> None:
    with Session(engine) as db:
        stamp_request(db, sessions_service.latest_run(db, turn_id))
        db.commit()


def test_a_process_reads_only_the_requests_for_its_own_running_turns(engine):
    asked = _run(engine, "me", stamped=True)
    not_asked = _run(engine, "me")
    others = _run(engine, "another", stamped=True)
    ended = _run(engine, "me", status="completed", stamped=True)
    assert requested_turns(engine, "me", [asked, not_asked, others, ended]) == [asked]
    assert requested_turns(engine, "me", [not_asked]) == []


@dataclass
class _Handle:
    cancel_requested: bool = False
    asked: int = 0

    def request_cancel(self) -> None:
        self.cancel_requested = True
        self.asked += 1


def test_the_watcher_cancels_a_stamped_turn_once_and_stops_when_no_turn_runs(engine):
    first, second = _run(engine, "me"), _run(engine, "me")
    live = {first: _Handle(), second: _Handle()}

    async def run() -> CancelWatcher:
        watcher = CancelWatcher(engine, "me", live, poll_s=0.02)
        watcher.ensure_running()
        await asyncio.sleep(0.2)
        assert live[first].asked == 0 and live[second].asked == 0  # nobody asked yet
        await asyncio.to_thread(_stamp, engine, first)
        for _ in range(250):
            if live[first].asked:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)  # more polls: a handle asked once is not asked again
        assert (live[first].asked, live[second].asked) == (1, 0)
        live.clear()  # the turns ended
        await asyncio.wait_for(asyncio.shield(watcher._task), 5)
        return watcher

    assert asyncio.run(run())._task.done()


def test_a_watcher_without_an_owner_never_starts(engine):
    async def run() -> CancelWatcher:
        watcher = CancelWatcher(engine, None, {"t": _Handle()}, poll_s=0.02)
        watcher.ensure_running()
        return watcher

    assert asyncio.run(run())._task is None
