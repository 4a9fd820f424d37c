"""What a start-up does about the turns a dead process left behind (kill -9, power loss, OOM).

Sessions, branches, turns, runs and spans are rows committed as they change (SQLite in WAL
mode keeps every committed row through a kill); the LangGraph checkpointer holds each
branch's thread after every node. So after a crash:

- A turn left `running` was cut mid-run: in a model call, a tool, or the resumed half of an
  approved action. Nothing can resume it (the model's stream is gone, a tool may have run
  halfway), so it is marked `failed` with a reason a person can read. Its branch head never
  moved (only a completed turn moves it), and the next turn on the branch starts from the
  head turn's end checkpoint, not from the half-advanced state the cut turn left in the
  thread: the branch is exactly as it was before the turn, and `POST /api/turns/{id}/retry`
  runs the same message again as a new turn. (Were the checkpoint store itself lost, the
  next turn seeds the thread from the history the turn tree records: app/services/turns.py.)
- A turn left `awaiting_approval` was not running: the process was only waiting for the
  operator, and the graph's interrupt is in the checkpointer. It stays resumable, its
  approval stays pending, and a decision resumes the run from its checkpoint exactly as it
  would have without the crash: failing it would throw away a proposal the operator may
  already be reading. Only when the checkpointer holds no pending interrupt for the run
  (its file lost or reset) is the turn failed and its approval `expired`, because deciding
  it could resume nothing; the turn can then be retried like any failed one.
- Files a cut turn's tools wrote (a chapter approved just before the crash) were staged, never
  visible (app/services/workspace.py); failing the turn deletes them, so its retry finds the
  branch's files as they were before it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from app.db.models import Run, Turn, TurnStatus
from app.services import turn_records
from app.services.workspace import discard_abandoned

log = logging.getLogger(__name__)

INTERRUPTED = ("the workbench stopped while this turn was running (the process ended: a crash, a kill or a "
               "restart); nothing was lost before it, and the turn can be retried")
PAUSE_LOST = ("the workbench restarted and the paused state of this turn's approval is gone (no checkpoint holds "
              "it), so the decision could resume nothing; the turn can be retried")


def mark_interrupted_turns(db: Session, alive: Callable[[str | None], bool] = lambda owner: False) -> int:
    """Turns and runs left `running` by a stopped process become `failed` (INTERRUPTED), and
    the files they staged are deleted. `alive(run.owner)` (app/services/liveness.py) spares
    those another live workbench process on the same database is running."""
    running = db.exec(select(Run).where(Run.status == TurnStatus.RUNNING)).all()
    live_turns = {r.turn_id for r in running if alive(r.owner)}
    runs = [r for r in running if r.turn_id not in live_turns]
    turns = [t for t in db.exec(select(Turn).where(Turn.status == TurnStatus.RUNNING)).all()
             if t.id not in live_turns]
    turn_records.end(db, TurnStatus.FAILED, INTERRUPTED, *turns, *runs)
    discard_abandoned(db)
    db.commit()
    if turns:
        log.warning("marked %d interrupted turn(s) failed: %s", len(turns), ", ".join(t.id for t in turns))
    return len(turns)


async def expire_lost_approvals(engine: Engine, graph: Any) -> int:
    """Fail the `awaiting_approval` turns whose run has no pending interrupt in the
    checkpointer (their approvals become `expired`); the others stay resumable."""
    paused_status = TurnStatus.AWAITING_APPROVAL
    with Session(engine) as db:
        paused = [(turn.id, run.id, run.thread_id) for turn, run in db.exec(
            select(Turn, Run).where(Turn.status == paused_status, Run.turn_id == Turn.id,
                                    Run.status == paused_status)).all()]
        orphans = [t.id for t in db.exec(select(Turn).where(Turn.status == paused_status)).all()
                   if t.id not in {p[0] for p in paused}]  # no paused run at all: nothing to resume
    lost = list(orphans)
    for turn_id, _, thread_id in paused:
        state = await graph.aget_state({"configurable": {"thread_id": thread_id}})
        if not state.interrupts:
            lost.append(turn_id)
    if not lost:
        return 0
    with Session(engine) as db:
        for turn in db.exec(select(Turn).where(col(Turn.id).in_(lost))).all():
            turn_records.expire(db, turn, PAUSE_LOST)
        discard_abandoned(db)
        db.commit()
    log.warning("failed %d paused turn(s) whose checkpoint is gone: %s", len(lost), ", ".join(lost))
    return len(lost)
