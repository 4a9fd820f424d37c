"""What a turn is asked: a new turn's request checked, and a turn's message asked once more.

A failed turn (the model backend failed, or the workbench stopped under it: see
app/services/recovery.py) is retried as a new turn with the same message and options, on the
same branch from the same parent, so from the parent's end checkpoint: the failed turn's
half-advanced checkpoints are never continued, and the failed turn stays in the tree as it was.
The files its tools wrote went with it (they are staged until a turn completes:
app/services/workspace.py), so the retry finds the branch's files as the failed turn did. The
first turn of a branch forked inside a turn continues that turn: its message again, from the
fork's checkpoint. Both rebuild the request one way (`rerun_request`): the turn's message and
its run's options (`RunOptions`).
"""

from __future__ import annotations

from typing import Any

from sqlmodel import Session

from app.db.models import Branch, RunOptions, Turn, TurnCreate, TurnStatus
from app.errors import Conflict, MessageTooLong, WorkbenchError
from app.services import sessions as sessions_service
from app.services.turn_start import branch_start


def validate_message(message: str, max_chars: int) -> str:
    if not message or not message.strip():
        raise WorkbenchError("message must not be empty", "empty_message", 422)
    if len(message) > max_chars:
        raise MessageTooLong(f"message has {len(message)} characters; the limit is "
                             f"{max_chars} (ARBOR_MAX_MESSAGE_CHARS)")
    return message


def check_tool_choice(choice: Any, scenario: Any) -> None:
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


def branch_busy(branch_id: str, busy: Turn) -> Conflict:
    return Conflict(f"branch {branch_id!r} already has a turn that is {busy.status} ({busy.id}); "
                    "wait for it, answer its approval, or fork a new branch", "branch_busy")


def rerun_request(db: Session, turn: Turn, branch_id: str) -> TurnCreate:
    """`turn`'s message with its run's options, as a new turn's request on `branch_id`: the one
    way a retry and a continue rebuild what the turn was asked."""
    options = RunOptions.of(sessions_service.latest_run(db, turn.id))
    return TurnCreate(message=turn.user_message, branch_id=branch_id, force_tool=options.force_tool,
                      tool_choice=options.tool_choice)


def retry_request(db: Session, turn_id: str) -> tuple[str, TurnCreate]:
    """The session and request of a retry of turn `turn_id`: 409 unless the turn failed (or was
    cancelled) and its branch still ends where the turn started (a branch that moved on since
    would put the retry after newer turns: fork from the parent instead)."""
    turn = sessions_service.get_turn(db, turn_id)
    if turn.status not in (TurnStatus.FAILED, TurnStatus.CANCELLED):
        raise Conflict(f"turn {turn_id!r} is {turn.status}; only a failed or cancelled turn can be retried",
                       "turn_not_failed")
    branch = db.get(Branch, turn.branch_id)
    assert branch is not None  # a turn's branch goes with it
    if branch.head_turn_id != turn.parent_turn_id:
        raise Conflict(f"branch {branch.id!r} has moved on since turn {turn_id!r} failed (its head is now "
                       f"{branch.head_turn_id!r}); fork a branch from {turn.parent_turn_id!r} and send the "
                       "message there", "branch_moved")
    return turn.session_id, rerun_request(db, turn, turn.branch_id)


def continue_request(db: Session, session_id: str, branch_id: str) -> TurnCreate:
    """The request of the first turn of a branch forked inside a turn: that turn's message (409
    for a branch not forked so, or already continued)."""
    branch = sessions_service.get_branch(db, sessions_service.get_session(db, session_id), branch_id)
    cut = branch_start(db, branch).cut
    if cut is None:
        raise Conflict(f"branch {branch_id!r} has no turn to continue (it was not forked inside a turn, "
                       "or its first turn ran)", "nothing_to_continue")
    return rerun_request(db, cut, branch.id)
