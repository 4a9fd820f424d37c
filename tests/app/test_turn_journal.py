"""A turn's event journal (app/services/turn_journal.py) and the follower that reads it
(app/services/turn_replay.py), on SQLite and PostgreSQL. The writer and the follower share
only the database here, as two workbench processes do; tests/app/test_multi_process.py runs
them in two real processes."""

from __future__ import annotations

import asyncio

import pytest
from sqlmodel import Session, col, select

from app.db.engine import make_engine
from app.db.models import Run, Turn, TurnEvent, utcnow
from app.services import sessions as sessions_service
from app.services.turn_journal import TurnJournal, merged_tokens, read_events
from app.services.turn_replay import PROCESS_LOST, FollowTiming, RecordedTurn
from tests.app.support import make_settings

pytestmark = [pytest.mark.usefixtures("workbench_database"), pytest.mark.timeout(60)]

FAST = FollowTiming(poll_s=0.02, liveness_s=0.05, grace_s=0.5)


def test_merged_tokens_joins_only_consecutive_plain_tokens():
    events = [{"type": "turn"}, {"type": "token", "text": "a"}, {"type": "token", "text": "b"},
              {"type": "tool_call", "name": "x"}, {"type": "token", "text": "c"},
              {"type": "token", "text": "d", "x": 1}]
    assert merged_tokens(events) == [{"type": "turn"}, {"type": "token", "text": "ab"},
                                     {"type": "tool_call", "name": "x"},
                                     {"type": "token", "text": "c"}, {"type": "token", "text": "d", "x": 1}]


@pytest.fixture
def engine(tmp_path):
    engine = make_engine(make_settings(tmp_path, "http://127.0.0.1:9/v1").database_url)
    yield engine
    engine.dispose()


def _turn(engine, status: str = "running", owner: str | None = "writer") -> Turn:
    with Session(engine) as db:
        session = sessions_service.create_session(db, "lab")
        turn = Turn(session_id=session.id, branch_id=session.active_branch_id, user_message="hi", status=status)
        db.add(turn)
        db.flush()
        db.add(Run(session_id=session.id, branch_id=turn.branch_id, turn_id=turn.id, thread_id="t", owner=owner,
                   status=status))
        if status != "running":
            turn.finished_at, turn.final_answer = utcnow(), "done"
        db.commit()
        db.refresh(turn)
        return turn


def _set_status(engine, turn_id: str, status: str, **fields) -> None:
    with Session(engine) as db:
        turn = db.get(Turn, turn_id)
        turn.status, turn.finished_at = status, utcnow()
        for name, value in fields.items():
            setattr(turn, name, value)
        db.add(turn)
        db.commit()


def _journal(engine, turn: Turn, flush_s: float) -> TurnJournal:
    return TurnJournal(engine, session_id=turn.session_id, branch_id=turn.branch_id, turn_id=turn.id, segment=0,
                       flush_s=flush_s)


def _rows(engine, turn_id: str) -> list[TurnEvent]:
    with Session(engine) as db:
        return read_events(db, turn_id, 0)


def _script(turn: Turn) -> list[dict]:
    return [{"type": "turn", "turn_id": turn.id}, *({"type": "token", "text": f"w{i} "} for i in range(30)),
            {"type": "tool_call", "name": "echo", "arguments": "{}", "tool_call_id": "c1", "step": 1},
            *({"type": "token", "text": f"v{i} "} for i in range(10)),
            {"type": "final", "turn_id": turn.id, "content": "done"}]


def test_the_journal_keeps_the_events_in_order_with_tokens_merged(engine):
    turn = _turn(engine)
    events = _script(turn)

    async def write() -> None:
        journal = _journal(engine, turn, flush_s=0.05)
        for event in events:
            journal.add(event)
            await asyncio.sleep(0.005)  # several batches
        journal.close()
        await journal.wait_written()

    asyncio.run(write())
    rows = _rows(engine, turn.id)
    assert [r.seq for r in rows] == list(range(len(rows)))
    payloads = [r.payload for r in rows]
    assert merged_tokens(payloads) == merged_tokens(events)  # the same stream, however it was batched
    assert 5 <= len(payloads) < len(events)
    assert [r.type for r in rows] == [p["type"] for p in payloads]


def test_a_terminal_event_is_written_without_waiting_for_the_batch(engine):
    turn = _turn(engine)

    async def write() -> list[TurnEvent]:
        journal = _journal(engine, turn, flush_s=600)  # a batch would wait ten minutes
        journal.add({"type": "token", "text": "x"})
        journal.add({"type": "final", "turn_id": turn.id, "content": "x"})
        for _ in range(500):
            rows = await asyncio.to_thread(_rows, engine, turn.id)
            if rows:
                break
            await asyncio.sleep(0.02)
        journal.close()
        await journal.wait_written()
        return rows

    assert [r.type for r in asyncio.run(write())] == ["token", "final"]


def test_a_follower_replays_what_was_written_then_follows_to_the_end(engine):
    turn = _turn(engine)
    events = _script(turn)

    async def run() -> tuple[list[dict], int]:
        journal = _journal(engine, turn, flush_s=0.03)
        for event in events[:10]:
            journal.add(event)
        while len(await asyncio.to_thread(_rows, engine, turn.id)) == 0:
            await asyncio.sleep(0.01)
        follower = await asyncio.to_thread(RecordedTurn(engine, turn.id, lambda owner: True, FAST).open)
        reading = asyncio.create_task(follower.collect())
        for event in events[10:-1]:
            journal.add(event)
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.3)
        assert not reading.done()  # still following: the turn runs and no terminal event came
        await asyncio.to_thread(_set_status, engine, turn.id, "completed", final_answer="done")
        journal.add(events[-1])
        journal.close()
        await journal.wait_written()
        return await asyncio.wait_for(reading, 10), len(await asyncio.to_thread(_rows, engine, turn.id))

    followed, rows = asyncio.run(run())
    assert merged_tokens(followed) == merged_tokens(events) and len(followed) == rows
    # and once it has ended, a new follower replays the same rows at once
    again = asyncio.run(RecordedTurn(engine, turn.id, lambda owner: True, FAST).open().collect())
    assert again == followed


def test_a_turn_without_a_journal_is_told_from_its_rows(engine):
    turn = _turn(engine, status="completed")  # e.g. recorded before the journal existed
    events = asyncio.run(RecordedTurn(engine, turn.id, lambda owner: True, FAST).open().collect())
    assert [e["type"] for e in events] == ["turn", "final"]
    assert events[0]["replayed"] is True and events[1]["content"] == "done"


def test_a_turn_ended_without_its_terminal_row_gets_one_rebuilt(engine):
    turn = _turn(engine)

    async def run() -> list[dict]:
        journal = _journal(engine, turn, flush_s=0.01)
        journal.add({"type": "turn", "turn_id": turn.id})
        journal.add({"type": "token", "text": "half"})
        journal.close()  # the process stopped it without an event (a shutdown): the row says failed
        await journal.wait_written()
        await asyncio.to_thread(_set_status, engine, turn.id, "failed", error="the workbench stopped")
        return await RecordedTurn(engine, turn.id, lambda owner: True, FAST).open().collect()

    events = asyncio.run(run())
    assert [e["type"] for e in events] == ["turn", "token", "error"]
    assert events[-1]["message"] == "the workbench stopped" and events[-1]["retryable"] is True


def test_a_follower_of_a_turn_whose_process_died_says_so(engine):
    turn = _turn(engine, owner="a-dead-process")
    asked: list[str | None] = []

    def alive(owner: str | None) -> bool:
        asked.append(owner)
        return False

    events = asyncio.run(asyncio.wait_for(RecordedTurn(engine, turn.id, alive, FAST).open().collect(), 10))
    assert [e["type"] for e in events] == ["turn", "error"]
    assert events[-1]["error_type"] == "process_lost" and events[-1]["message"] == PROCESS_LOST
    assert asked == ["a-dead-process"]


def test_deleting_the_session_deletes_its_journal(engine):
    turn = _turn(engine, status="completed")

    async def write() -> None:
        journal = _journal(engine, turn, flush_s=0.01)
        journal.add({"type": "final", "turn_id": turn.id, "content": "done"})
        journal.close()
        await journal.wait_written()

    asyncio.run(write())
    with Session(engine) as db:
        assert len(db.exec(select(TurnEvent).where(col(TurnEvent.turn_id) == turn.id)).all()) == 1
        sessions_service.delete_session(db, sessions_service.get_session(db, turn.session_id))
    with Session(engine) as db:
        assert db.exec(select(TurnEvent)).all() == []
