"""POST /api/sessions/{id}/turns runs a turn (SSE by default); GET /api/turns/{id} reads one;
POST /api/turns/{id}/retry runs a failed (or cancelled) turn's message again; POST
/api/sessions/{id}/branches/{id}/continue runs the turn a branch forked inside of on from there;
POST /api/turns/{id}/cancel stops a running turn; GET /api/turns/{id}/events replays a turn's
events and follows it while it runs."""

from __future__ import annotations

from fastapi import APIRouter

from app.api.deps import DbDep, TurnServiceDep
from app.api.streaming import collected, event_stream
from app.db.models import TurnCreate, TurnPublic, TurnRetry
from app.services import sessions as sessions_service

router = APIRouter(tags=["turns"])


@router.post("/sessions/{session_id}/turns")
async def run_turn(session_id: str, request: TurnCreate, turns: TurnServiceDep):
    """Run one turn on `branch_id` (default: the active branch). `stream` false waits and answers JSON."""
    handle = await turns.start_turn(session_id, request)
    if request.stream:
        return event_stream(handle)
    return await collected(handle, turns)


@router.post("/sessions/{session_id}/branches/{branch_id}/continue")
async def continue_branch(session_id: str, branch_id: str, turns: TurnServiceDep, request: TurnRetry | None = None):
    """The first turn of a branch forked inside a turn (from a checkpoint): that turn's message,
    run on from the checkpoint; answers like POST .../turns (409 for any other branch)."""
    handle = await turns.continue_branch(session_id, branch_id)
    if request is None or request.stream:
        return event_stream(handle)
    return await collected(handle, turns)


@router.get("/turns/{turn_id}")
def get_turn(turn_id: str, db: DbDep) -> TurnPublic:
    return TurnPublic.model_validate(sessions_service.get_turn(db, turn_id))


@router.post("/turns/{turn_id}/retry")
async def retry_turn(turn_id: str, turns: TurnServiceDep, request: TurnRetry | None = None):
    """Run a failed turn's message again as a new turn, on the same branch from the same parent
    (409 turn_not_failed / branch_moved otherwise); answers like POST .../turns."""
    handle = await turns.retry_turn(turn_id)
    if request is None or request.stream:
        return event_stream(handle)
    return await collected(handle, turns)


@router.post("/turns/{turn_id}/cancel")
async def cancel_turn(turn_id: str, turns: TurnServiceDep) -> TurnPublic:
    """Stop a running turn (its model request is closed) or one waiting for an approval, and
    answer the turn: `cancelled`, or how it ended when it was already recording its outcome.
    Sent to any workbench process: the one running the turn stops it. The branch keeps its
    last completed turn as its head. 409 for a turn that had ended."""
    return await turns.cancel_turn(turn_id)


@router.get("/turns/{turn_id}/events")
async def turn_events(turn_id: str, turns: TurnServiceDep):
    """Server-Sent Events: what a running turn has streamed so far, then what follows, until it
    ends, from any workbench process on the database (one that does not run the turn reads its
    journal: in batches, tokens merged); for a turn that has ended, its events replayed."""
    return event_stream(await turns.follow(turn_id))
