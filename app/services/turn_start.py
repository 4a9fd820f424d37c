"""Where a turn starts on its branch's thread.

Each branch is one LangGraph thread ("branch-<branch id>") whose checkpoint state holds the
conversation. A turn's graph input is only the new user message and the per-turn resets
(steps, budget, awaiting, decisions, answer, outcome); it runs from an explicit checkpoint
of the thread: the end of the branch's head turn, or the branch's base when its head is the
parent's turn it was forked from (app/services/branch_threads.py). The turn records both
checkpoints (start, end) and, in its run's options, `history_len`: how many messages of the
state belong to earlier turns (the state's message count at its start), which the context
budget must know to compact.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from langgraph.types import Overwrite
from sqlmodel import Session

from app.agent.context_state import ContextState
from app.agent.messages import from_openai
from app.db.checkpoints import branch_thread_id
from app.db.models import Branch, Turn
from app.errors import WorkbenchError
from app.services import branch_threads
from app.services import sessions as sessions_service

log = logging.getLogger(__name__)


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

    def graph_input(self, message: str, max_steps: int) -> dict | None:
        """Only the turn's input: the history is in the checkpoint it starts from. `decisions`
        merges by reducer, so its reset must overwrite. A continued turn takes no input: the
        graph runs its pending step."""
        if self.cut is not None:
            return None
        return {"messages": from_openai([{"role": "user", "content": message}]), "steps": 0,
                "max_steps": max_steps, "awaiting": [], "decisions": Overwrite({}), "final_answer": None,
                "outcome": None}


def turn_start(db: Session, branch: Branch, head: Turn | None) -> TurnStart:
    """Where the next turn of `branch` (head turn `head`) starts: the end of its head turn when
    that turn ran on this branch, else (nothing run here yet) the branch's base. Where neither
    checkpoint exists (a new branch, turns recorded before checkpoints were, a lost checkpoint
    store) the history the turn tree records seeds the thread."""
    thread_id = branch_thread_id(branch.id)
    own_head = head if head is not None and head.branch_id == branch.id else None
    checkpoint_id = own_head.end_checkpoint_id if own_head else branch.base_checkpoint_id
    seed = sessions_service.history(db, branch)
    if own_head or branch.fork_turn_id in (None, branch.head_turn_id):
        return TurnStart(thread_id, checkpoint_id, seed, is_base=own_head is None)
    cut = sessions_service.get_turn(db, str(branch.fork_turn_id))  # forked inside it (its head is cut's parent)
    return TurnStart(thread_id, checkpoint_id, seed, is_base=True, cut=cut,
                     cut_history_len=sessions_service.turn_history_len(db, cut))


def branch_start(db: Session, branch: Branch) -> TurnStart:
    return turn_start(db, branch, db.get(Turn, branch.head_turn_id) if branch.head_turn_id else None)


async def open_start(graph: Any, start: TurnStart) -> tuple[str, int]:
    """The checkpoint the turn starts from and the number of messages its state holds (all
    of earlier turns). Where the branch has none yet, or the checkpointer lost it (its store
    was reset), the history the turn tree records is written as a first checkpoint."""
    checkpoint_id = start.checkpoint_id
    snapshot = await branch_threads.snapshot_at(graph, start.thread_id, checkpoint_id) if checkpoint_id else None
    if start.cut is not None:
        if checkpoint_id is None or snapshot is None:  # a turn's middle is in no table: nothing to seed it from
            raise WorkbenchError(f"checkpoint {checkpoint_id!r} of thread {start.thread_id!r} is gone; "
                                 "fork again", "checkpoint_missing", 409)
        return checkpoint_id, start.cut_history_len
    if checkpoint_id is None or snapshot is None:
        if checkpoint_id is not None:
            log.warning("checkpoint %s of %s is gone; seeding the thread from the recorded turns",
                        checkpoint_id, start.thread_id)
        checkpoint_id = await branch_threads.seed_thread(graph, start.thread_id, start.seed)
        snapshot = await branch_threads.snapshot_at(graph, start.thread_id, checkpoint_id)
        assert snapshot is not None  # just written
    return checkpoint_id, len(snapshot.values.get("messages") or [])


async def next_conversation(graph: Any, start: TurnStart) -> tuple[list[dict], ContextState]:
    """The conversation a turn from `start` would start with (OpenAI messages, no system prompt)
    and the branch's context state there (its compaction level, its estimate)."""
    snapshot = await branch_threads.snapshot_at(graph, start.thread_id, start.checkpoint_id) \
        if start.checkpoint_id else None
    if snapshot is None:  # what its next turn would seed the thread with (see open_start)
        return start.seed, ContextState()
    return (branch_threads.openai_messages(snapshot.values.get("messages") or []),
            ContextState.of(snapshot.values.get("context_fit")))
