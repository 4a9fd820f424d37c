"""SQLModel tables and their API shapes (Base / Create / Public families).

A session is a tree of turns. Every turn has a parent turn (None for the first turn) and the
branch it was created on. A branch is a named pointer to a head turn: the path from its head
up to the root is the branch's story, and the tables keep it, with names and traces.

The conversation itself lives in LangGraph checkpoints: one thread per branch
(app/db/checkpoints.py). A turn records the checkpoint it started from and the one it ended
at; a branch records the checkpoint of its own thread that its first turn starts from (its
`base`: a copy of the parent's state where it was forked). Forking from turn T makes a branch
whose head is T and whose base is T's end state, so it shares exactly T's history (the
prefix an inference server's cache reuses).

A run is one execution of the agent graph for a turn (on its branch's thread); spans record
every model and tool call of the run; artifacts keep tool results in full when the context
only received a trimmed version; approvals are proposed actions waiting for the operator.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel
from sqlalchemy import JSON, Column, Index, Text, UniqueConstraint, text
from sqlmodel import Field, SQLModel


def new_id() -> str:
    return uuid.uuid4().hex[:16]


def utcnow() -> datetime:
    return datetime.now(UTC)


def _json(nullable: bool = True) -> Any:
    return Field(default=None, sa_column=Column(JSON, nullable=nullable))


# -- sessions -------------------------------------------------------------------------------
class SessionBase(SQLModel):
    scenario: str = Field(index=True, max_length=64)
    title: str = Field(default="", max_length=200)


class SessionCreate(SessionBase):
    """POST /api/sessions body."""


class AgentSession(SessionBase, table=True):
    __tablename__ = "sessions"
    id: str = Field(default_factory=new_id, primary_key=True)
    created_at: datetime = Field(default_factory=utcnow)
    active_branch_id: str | None = Field(default=None)


class SessionPublic(SessionBase):
    id: str
    created_at: datetime
    active_branch_id: str | None


# -- branches -------------------------------------------------------------------------------
class BranchBase(SQLModel):
    name: str = Field(default="main", max_length=100)


class BranchCreate(SQLModel):
    """POST /api/sessions/{id}/branches body: fork from the end of `turn_id` (null = an empty
    branch), or from `checkpoint_id`, a checkpoint inside turn `turn_id` (GET
    .../branches/{id}/checkpoints lists them)."""
    turn_id: str | None = None
    checkpoint_id: str | None = Field(default=None, max_length=64)
    name: str | None = Field(default=None, max_length=100)


class Branch(BranchBase, table=True):
    __tablename__ = "branches"
    id: str = Field(default_factory=new_id, primary_key=True)
    session_id: str = Field(foreign_key="sessions.id", index=True)
    fork_turn_id: str | None = Field(default=None)  # no FK: turns already reference branches
    head_turn_id: str | None = Field(default=None)
    # the parent's checkpoint this branch was forked from (None: forked from a turn recorded
    # before checkpoints were, or an empty branch)
    fork_checkpoint_id: str | None = Field(default=None, max_length=64)
    # the checkpoint of this branch's own thread that its first turn starts from (None until
    # it exists: a main or empty branch gets it when its first turn starts)
    base_checkpoint_id: str | None = Field(default=None, max_length=64)
    created_at: datetime = Field(default_factory=utcnow)


class BranchPublic(BranchBase):
    id: str
    session_id: str
    fork_turn_id: str | None
    head_turn_id: str | None
    fork_checkpoint_id: str | None
    created_at: datetime


# -- turns ----------------------------------------------------------------------------------
class TurnBase(SQLModel):
    user_message: str = Field(sa_column=Column(Text, nullable=False))


class TurnCreate(SQLModel):
    """POST /api/sessions/{id}/turns body (validated further in the route)."""
    message: str
    branch_id: str | None = None
    force_tool: bool = False
    tool_choice: str | dict | None = None
    stream: bool = True


class TurnRetry(SQLModel):
    """POST /api/turns/{id}/retry body (optional)."""
    stream: bool = True


class TurnStatus(StrEnum):
    """The status of a turn and of its run (stored as these strings; the transitions between
    them are app/services/turn_records.py)."""
    RUNNING = "running"
    AWAITING_APPROVAL = "awaiting_approval"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class ApprovalStatus(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    CANCELLED = "cancelled"  # its turn was cancelled while paused
    EXPIRED = "expired"  # its paused run was lost (app/services/recovery.py)


# The turn states that hold their branch: a branch has at most one such turn. A unique partial
# index makes the database, not one process's memory, refuse a second (so two workbench
# processes on one PostgreSQL cannot both start a turn on a branch).
ACTIVE_TURN_STATES = (TurnStatus.RUNNING, TurnStatus.AWAITING_APPROVAL)
_HOLDS_BRANCH = text("status IN (" + ", ".join(f"'{s}'" for s in ACTIVE_TURN_STATES) + ")")
ONE_ACTIVE_TURN_INDEX = "uq_turns_one_active_per_branch"


class Turn(TurnBase, table=True):
    __tablename__ = "turns"
    __table_args__ = (Index(ONE_ACTIVE_TURN_INDEX, "branch_id", unique=True,
                            sqlite_where=_HOLDS_BRANCH, postgresql_where=_HOLDS_BRANCH),)
    id: str = Field(default_factory=new_id, primary_key=True)
    session_id: str = Field(foreign_key="sessions.id", index=True)
    branch_id: str = Field(foreign_key="branches.id", index=True)
    parent_turn_id: str | None = Field(default=None, foreign_key="turns.id")
    depth: int = 0
    status: str = Field(default=TurnStatus.RUNNING, max_length=32)  # a TurnStatus
    # answered | budget_exhausted (when completed)
    outcome: str | None = Field(default=None, max_length=32)
    final_answer: str | None = Field(default=None, sa_column=Column(Text))
    error: str | None = Field(default=None, sa_column=Column(Text))
    # the OpenAI messages this turn added to the conversation (user, assistant, tool ...)
    messages: list[dict] | None = _json()
    # the checkpoints of the branch's thread this turn started from and ended at (None: not
    # reached, or a turn recorded before checkpoints were)
    start_checkpoint_id: str | None = Field(default=None, max_length=64)
    end_checkpoint_id: str | None = Field(default=None, max_length=64)
    created_at: datetime = Field(default_factory=utcnow)
    finished_at: datetime | None = None


class TurnPublic(TurnBase):
    id: str
    session_id: str
    branch_id: str
    parent_turn_id: str | None
    depth: int
    status: str
    outcome: str | None
    final_answer: str | None
    error: str | None
    messages: list[dict] | None
    start_checkpoint_id: str | None
    end_checkpoint_id: str | None
    created_at: datetime
    finished_at: datetime | None


# -- runs -----------------------------------------------------------------------------------
class Run(SQLModel, table=True):
    __tablename__ = "runs"
    id: str = Field(default_factory=new_id, primary_key=True)
    session_id: str = Field(foreign_key="sessions.id", index=True)
    branch_id: str = Field(foreign_key="branches.id")
    turn_id: str = Field(foreign_key="turns.id", index=True)
    thread_id: str = Field(max_length=64)  # the LangGraph thread: its branch's ("turn-<id>" before)
    status: str = Field(default=TurnStatus.RUNNING, max_length=32)  # a TurnStatus, as its turn's
    options: dict | None = _json()  # RunOptions, stored as a JSON object
    # the workbench process running it (app/services/liveness.py); None: recorded before owners
    owner: str | None = Field(default=None, max_length=128)
    # another workbench process asked the owner to cancel it (app/services/remote_cancel.py)
    cancel_requested_at: datetime | None = None
    started_at: datetime = Field(default_factory=utcnow)
    ended_at: datetime | None = None
    error: str | None = Field(default=None, sa_column=Column(Text))


class RunOptions(BaseModel):
    """What a run was asked to do, kept in `Run.options` (the same JSON object as always, so
    rows recorded before this type read back)."""
    force_tool: bool = False
    tool_choice: str | dict | None = None
    retry_of: str | None = None  # the failed turn this one runs again
    history_len: int | None = None  # messages of the thread's state from earlier turns (set at start)

    @classmethod
    def of(cls, run: Run | None) -> RunOptions:
        return cls.model_validate((run.options if run else None) or {})

    def stored(self) -> dict:
        """The JSON object for `Run.options`: retry_of and history_len only once set."""
        return self.model_dump(exclude_none=True) | {"tool_choice": self.tool_choice}


# -- turn event journal ---------------------------------------------------------------------
class TurnEvent(SQLModel, table=True):
    """One event a turn streamed (app/services/turn_journal.py), so that any workbench process
    on the database can replay and follow the turn, not only the one running it.

    A turn's events come in segments: segment 0 from its start to its first pause for an
    approval (or its end), segment k from its k-th resume. `seq` counts within a segment;
    consecutive tokens are stored merged, so a row's `payload` is the event as emitted,
    except that a `token` row's text may join several tokens."""
    __tablename__ = "turn_events"
    __table_args__ = (UniqueConstraint("turn_id", "segment", "seq"),)
    id: int | None = Field(default=None, primary_key=True)
    session_id: str = Field(foreign_key="sessions.id", index=True)
    branch_id: str = Field(foreign_key="branches.id", index=True)
    turn_id: str = Field(foreign_key="turns.id")
    segment: int
    seq: int
    type: str = Field(max_length=32)
    payload: dict = Field(sa_column=Column(JSON, nullable=False))
    created_at: datetime = Field(default_factory=utcnow)


# -- trace spans ----------------------------------------------------------------------------
class Span(SQLModel, table=True):
    """One model call (kind "model") or tool call (kind "tool").

    `attributes` uses OpenTelemetry GenAI names (gen_ai.operation.name, gen_ai.request.model,
    gen_ai.usage.input_tokens, gen_ai.usage.output_tokens, gen_ai.usage.cache_read.input_tokens,
    gen_ai.tool.name, gen_ai.tool.call.id, ...) plus `arbor.*` names for what GenAI lacks
    (arbor.cache.source, arbor.ttft_ms, arbor.tool.trimmed ...).
    """
    __tablename__ = "spans"
    id: str = Field(default_factory=new_id, primary_key=True)
    session_id: str = Field(foreign_key="sessions.id", index=True)
    branch_id: str = Field(foreign_key="branches.id")
    turn_id: str = Field(foreign_key="turns.id", index=True)
    run_id: str = Field(foreign_key="runs.id")
    kind: str = Field(max_length=16)
    name: str = Field(max_length=200)
    status: str = Field(default="ok", max_length=16)  # ok | error
    error: str | None = Field(default=None, sa_column=Column(Text))
    started_at: datetime = Field(default_factory=utcnow)
    duration_ms: float | None = None
    ttft_ms: float | None = None
    attributes: dict | None = _json()
    request: dict | None = _json()   # model: exact request body; tool: {"arguments": ...}
    response: dict | None = _json()  # model: assistant message + usage; tool: {"result": ..., "context": ...}
    artifact_id: str | None = Field(default=None)


class SpanPublic(SQLModel):
    id: str
    turn_id: str
    run_id: str
    branch_id: str
    kind: str
    name: str
    status: str
    error: str | None
    started_at: datetime
    duration_ms: float | None
    ttft_ms: float | None
    attributes: dict | None
    request: dict | None
    response: dict | None
    artifact_id: str | None


# -- artifacts ------------------------------------------------------------------------------
class Artifact(SQLModel, table=True):
    """A tool result kept in full when only a trimmed version entered the context."""
    __tablename__ = "artifacts"
    id: str = Field(default_factory=new_id, primary_key=True)
    session_id: str = Field(foreign_key="sessions.id", index=True)
    turn_id: str = Field(foreign_key="turns.id")
    tool_name: str = Field(max_length=100)
    tool_call_id: str = Field(max_length=100)
    content: str = Field(sa_column=Column(Text, nullable=False))
    chars: int
    context_chars: int
    created_at: datetime = Field(default_factory=utcnow)


class ArtifactPublic(SQLModel):
    id: str
    session_id: str
    turn_id: str
    tool_name: str
    tool_call_id: str
    content: str
    chars: int
    context_chars: int
    created_at: datetime


# -- branch workspaces ----------------------------------------------------------------------
class WorkspaceFile(SQLModel, table=True):
    """A file a tool wrote (an approved story chapter, ...), owned by one branch: a fork gets
    copies of its parent's files at the fork point (app/services/workspace.py). Written once:
    (branch, path) is unique.

    A file is `staged` (True) from its write until the turn that wrote it completes: only that
    turn's own tools see it. The turn's completion publishes it (NULL) in the transaction that
    records the completion; a turn that ends failed or cancelled deletes it."""
    __tablename__ = "workspace_files"
    __table_args__ = (UniqueConstraint("branch_id", "path"),)
    id: str = Field(default_factory=new_id, primary_key=True)
    session_id: str = Field(foreign_key="sessions.id", index=True)
    branch_id: str = Field(foreign_key="branches.id", index=True)
    path: str = Field(max_length=300)
    content: str = Field(sa_column=Column(Text, nullable=False))
    # the turn that wrote it, kept by copies (a fork from turn T takes the files written on
    # T's path); no foreign key: a copy names a turn of another branch
    turn_id: str = Field(max_length=32)
    created_at: datetime = Field(default_factory=utcnow)
    # nullable, so a database from before staging reads its files as published (app/db/migrate.py)
    staged: bool | None = Field(default=None)


class WorkspaceFilePublic(SQLModel):
    path: str
    chars: int
    turn_id: str
    created_at: datetime
    content: str | None = None


# -- approvals ------------------------------------------------------------------------------
class ApprovalDecision(SQLModel):
    """POST /api/approvals/{id} body."""
    approved: bool
    comment: str = Field(default="", max_length=2000)
    stream: bool = True


class Approval(SQLModel, table=True):
    __tablename__ = "approvals"
    id: str = Field(default_factory=new_id, primary_key=True)
    session_id: str = Field(foreign_key="sessions.id", index=True)
    branch_id: str = Field(foreign_key="branches.id")
    turn_id: str = Field(foreign_key="turns.id", index=True)
    run_id: str = Field(foreign_key="runs.id")
    tool_call_id: str = Field(max_length=100)
    tool_name: str = Field(max_length=100)
    arguments: dict | None = _json()
    status: str = Field(default=ApprovalStatus.PENDING, max_length=16)  # an ApprovalStatus
    comment: str | None = Field(default=None, sa_column=Column(Text))
    created_at: datetime = Field(default_factory=utcnow)
    decided_at: datetime | None = None
    # who decided: "operator" (the token or its session cookie) or the name a trusted proxy's
    # identity header gave (app/auth/guard.py); NULL when no person did (expiry, cancel, old rows)
    decided_by: str | None = Field(default=None, max_length=200)


class ApprovalPublic(SQLModel):
    id: str
    session_id: str
    branch_id: str
    turn_id: str
    tool_call_id: str
    tool_name: str
    arguments: dict | None
    status: str
    comment: str | None
    created_at: datetime
    decided_at: datetime | None
    decided_by: str | None = None


class SessionDetail(SessionPublic):
    """GET /api/sessions/{id}: the session with its whole turn tree and branches."""
    branches: list[BranchPublic]
    turns: list[TurnPublic]
    pending_approvals: list[ApprovalPublic]
