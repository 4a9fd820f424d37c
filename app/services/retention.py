"""Retention: what the workbench prunes as it ages (issue 35, item 8), so its disk stops growing.

Three kinds of data grow with every turn and are only ever read again by a person looking back
(the settings under `# -- retention` in app/settings.py, in days after the turn ended; 0 keeps
forever):

- **Trace span bodies** (`ARBOR_RETAIN_TRACES_DAYS`): a model span's `request` holds the whole
  prompt, so the bodies are most of the database. They become NULL; the span rows stay, with
  their timings, token counts and cache figures (the trace page and the cache statistics).
- **Turn events** (`ARBOR_RETAIN_TURN_EVENTS_DAYS`): the journal a turn's stream is replayed
  from. An ended turn keeps its messages, answer and error on its own row, and its steps in the
  trace; its replay, journal gone, is rebuilt from those rows (app/services/turn_replay.py).
- **Checkpoints inside turns** (`ARBOR_RETAIN_CHECKPOINTS_DAYS`): LangGraph writes one after
  every node, each holding the whole conversation. Only forks from inside a turn read them. The
  checkpoints the tree points to stay: every turn's start and end (the next turn starts from its
  head's end; a fork from a turn's end copies it) and every branch's base and fork point.

Never pruned: anything of a running or paused turn (its turn is not ended; the threads of a
branch holding such a turn are left whole), artifacts (a later turn's model may page through
them), turns, messages, approvals and files. Each prune also deletes the staged files of turns
that ended without completing (app/services/workspace.py; only a crash leaves any).

`prune` is one synchronous pass, run by `arbor prune` (app/cli.py) and every
`ARBOR_PRUNE_INTERVAL_S` by the running workbench (`PruneJob`, app/workbench.py). Deleting is
idempotent, so several workbench processes on one PostgreSQL may all run it. The work goes in
batches of turns, each its own short transaction, so a first prune of a large database never
holds SQLite's write lock for long.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import func, inspect, null, or_, text, update
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, delete, select

from app.db.checkpoints import branch_thread_id
from app.db.engine import affected_rows
from app.db.models import ACTIVE_TURN_STATES, Branch, Run, Span, Turn, TurnEvent, utcnow
from app.db.urls import is_postgres
from app.services.workspace import discard_abandoned
from app.settings import WorkbenchSettings

log = logging.getLogger(__name__)

ENDED_TURN_STATES = ("completed", "failed", "cancelled")
BATCH_TURNS = 200  # turns per transaction


@dataclass(frozen=True)
class RetentionPolicy:
    """Days after a turn ended that each kind is kept; 0 keeps it forever."""

    traces_days: float
    turn_events_days: float
    checkpoints_days: float

    @classmethod
    def of(cls, settings: WorkbenchSettings) -> RetentionPolicy:
        return cls(settings.retain_traces_days, settings.retain_turn_events_days, settings.retain_checkpoints_days)


@dataclass
class PruneReport:
    """What one prune removed."""

    span_bodies: int = 0  # spans whose request/response bodies were cleared
    turn_events: int = 0
    checkpoints: int = 0  # checkpoints inside ended turns (with their pending writes)
    staged_files: int = 0  # files staged by turns that ended without completing

    @property
    def total(self) -> int:
        return self.span_bodies + self.turn_events + self.checkpoints + self.staged_files

    def summary(self, policy: RetentionPolicy) -> str:
        def kept(days: float) -> str:
            return "kept forever" if days <= 0 else f"older than {days:g} days"
        return (f"span bodies cleared: {self.span_bodies} ({kept(policy.traces_days)}); "
                f"turn events deleted: {self.turn_events} ({kept(policy.turn_events_days)}); "
                f"checkpoints deleted: {self.checkpoints} ({kept(policy.checkpoints_days)}); "
                f"staged files of failed turns deleted: {self.staged_files}")


def prune(engine: Engine, settings: WorkbenchSettings, policy: RetentionPolicy | None = None,
          now: datetime | None = None) -> PruneReport:
    """Prune what `policy` (default: the settings') no longer keeps, as of `now` (default: the
    present); what was removed. Safe while turns run (see the module docstring)."""
    policy = policy or RetentionPolicy.of(settings)
    now = now or utcnow()
    report = PruneReport()
    with Session(engine) as db:
        report.staged_files = discard_abandoned(db)
        db.commit()
    if policy.traces_days > 0:
        for ids in _ended_turn_batches(engine, now - timedelta(days=policy.traces_days)):
            report.span_bodies += _clear_span_bodies(engine, ids)
    if policy.turn_events_days > 0:
        for ids in _ended_turn_batches(engine, now - timedelta(days=policy.turn_events_days)):
            report.turn_events += _delete_turn_events(engine, ids)
    if policy.checkpoints_days > 0:
        report.checkpoints = _prune_checkpoints(engine, settings, now - timedelta(days=policy.checkpoints_days))
    return report


# -- rows of the workbench's database -----------------------------------------------------------
def _ended_turn_batches(engine: Engine, before: datetime) -> Iterator[list[str]]:
    """Ids of the turns that ended before `before`, in batches (by id, so a batch pruned meanwhile
    never shifts the next one)."""
    ended = func.coalesce(Turn.finished_at, Turn.created_at)  # rows from before finished_at was kept
    after = ""
    while True:
        with Session(engine) as db:
            ids = list(db.exec(select(Turn.id).where(col(Turn.status).in_(ENDED_TURN_STATES), ended < before,
                                                     Turn.id > after)
                               .order_by(col(Turn.id)).limit(BATCH_TURNS)).all())
        if not ids:
            return
        yield ids
        after = ids[-1]


def _clear_span_bodies(engine: Engine, turn_ids: list[str]) -> int:
    with Session(engine) as db:
        # null(): SQL NULL, not the JSON text 'null' a plain None would store (a pruned span then
        # no longer matches, so a second prune counts nothing)
        cleared = affected_rows(db.execute(
            update(Span).where(col(Span.turn_id).in_(turn_ids),
                               or_(col(Span.request).is_not(None), col(Span.response).is_not(None)))
            .values(request=null(), response=null())))
        db.commit()
        return cleared


def _delete_turn_events(engine: Engine, turn_ids: list[str]) -> int:
    with Session(engine) as db:
        deleted = affected_rows(db.execute(delete(TurnEvent).where(col(TurnEvent.turn_id).in_(turn_ids))))
        db.commit()
        return deleted


# -- LangGraph checkpoints ------------------------------------------------------------------------
def _prune_checkpoints(engine: Engine, settings: WorkbenchSettings, before: datetime) -> int:
    with Session(engine) as db:
        kept: set[str] = set()
        for start, end in db.exec(select(Turn.start_checkpoint_id, Turn.end_checkpoint_id)).all():
            kept.update(c for c in (start, end) if c is not None)
        for base, fork in db.exec(select(Branch.base_checkpoint_id, Branch.fork_checkpoint_id)).all():
            kept.update(c for c in (base, fork) if c is not None)
        busy = {branch_thread_id(b) for b in db.exec(
            select(Turn.branch_id).where(col(Turn.status).in_(ACTIVE_TURN_STATES))).all()}
    deleted = 0
    with _checkpoint_store(engine, settings) as store:
        if store is None:  # no checkpoint was ever written
            return 0
        for ids in _ended_turn_batches(engine, before):
            with Session(engine) as db:
                threads = set(db.exec(select(Run.thread_id).where(col(Run.turn_id).in_(ids))).all()) - busy
            for thread_id in sorted(threads):
                deleted += store.prune_thread(thread_id, set(ids), kept)
    return deleted


class _CheckpointStore:
    """The checkpointer's tables, reached with plain SQL: LangGraph's savers delete whole threads
    only. Subclasses know the dialect."""

    def rows(self, thread_id: str) -> list[tuple[str, str, dict]]:
        """(checkpoint_ns, checkpoint_id, metadata) of every checkpoint of the thread."""
        raise NotImplementedError

    def delete(self, thread_id: str, doomed: list[tuple[str, str]]) -> None:
        raise NotImplementedError

    def prune_thread(self, thread_id: str, turn_ids: set[str], kept: set[str]) -> int:
        """Delete the checkpoints of `thread_id` written by one of `turn_ids` (their metadata's
        turn_id) that are not in `kept`; how many."""
        doomed = [(ns, cid) for ns, cid, metadata in self.rows(thread_id)
                  if _metadata(metadata).get("turn_id") in turn_ids and cid not in kept]
        if doomed:
            self.delete(thread_id, doomed)
        return len(doomed)


def _metadata(value: object) -> dict:
    if isinstance(value, (str, bytes)):
        value = json.loads(value)
    return value if isinstance(value, dict) else {}


class _SqliteStore(_CheckpointStore):
    """AsyncSqliteSaver's file: `checkpoints` holds each checkpoint whole, `writes` its pending
    writes."""

    def __init__(self, path: Path) -> None:
        # a writer (a running turn's checkpointer) holds the lock briefly: wait for it
        self.conn = sqlite3.connect(path, timeout=30)

    def rows(self, thread_id: str) -> list[tuple[str, str, dict]]:
        return self.conn.execute("SELECT checkpoint_ns, checkpoint_id, metadata FROM checkpoints WHERE thread_id = ?",
                                 (thread_id,)).fetchall()

    def delete(self, thread_id: str, doomed: list[tuple[str, str]]) -> None:
        with self.conn:  # one transaction
            for table in ("writes", "checkpoints"):
                self.conn.executemany(f"DELETE FROM {table} WHERE thread_id = ? AND checkpoint_ns = ? "
                                      "AND checkpoint_id = ?", [(thread_id, ns, cid) for ns, cid in doomed])


class _PostgresStore(_CheckpointStore):
    """AsyncPostgresSaver's tables in the workbench's own database: `checkpoints` (each naming its
    channels' versions), `checkpoint_blobs` (one value per channel version, shared by the
    checkpoints that name it) and `checkpoint_writes`."""

    # A blob no remaining checkpoint names is garbage, but only if it is older than the newest
    # version any checkpoint names (versions are zero-padded, so text order is their order): a
    # run saving right now writes its new blobs before the checkpoint naming them, and those
    # are always newer.
    _ORPHAN_BLOBS = text("""
        DELETE FROM checkpoint_blobs b
        WHERE b.thread_id = :thread_id
          AND NOT EXISTS (SELECT 1 FROM checkpoints c
                          WHERE c.thread_id = b.thread_id AND c.checkpoint_ns = b.checkpoint_ns
                            AND c.checkpoint -> 'channel_versions' ->> b.channel = b.version)
          AND b.version < (SELECT max(c.checkpoint -> 'channel_versions' ->> b.channel) FROM checkpoints c
                           WHERE c.thread_id = b.thread_id AND c.checkpoint_ns = b.checkpoint_ns)""")

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def rows(self, thread_id: str) -> list[tuple[str, str, dict]]:
        with self.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text(
                "SELECT checkpoint_ns, checkpoint_id, metadata FROM checkpoints WHERE thread_id = :t"),
                {"t": thread_id}).all()]

    def delete(self, thread_id: str, doomed: list[tuple[str, str]]) -> None:
        params = [{"t": thread_id, "ns": ns, "cid": cid} for ns, cid in doomed]
        with self.engine.begin() as conn:
            for table in ("checkpoint_writes", "checkpoints"):
                conn.execute(text(f"DELETE FROM {table} WHERE thread_id = :t AND checkpoint_ns = :ns "
                                  "AND checkpoint_id = :cid"), params)
            conn.execute(self._ORPHAN_BLOBS, {"thread_id": thread_id})


@contextlib.contextmanager
def _checkpoint_store(engine: Engine, settings: WorkbenchSettings) -> Iterator[_CheckpointStore | None]:
    """The checkpointer's store for `settings`; None where it holds no tables yet."""
    if is_postgres(settings.database_url):
        yield _PostgresStore(engine) if inspect(engine).has_table("checkpoints") else None
        return
    path = settings.checkpoint_path
    if path is None or not path.exists():
        yield None
        return
    store = _SqliteStore(path)
    try:
        has = store.conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'checkpoints'").fetchone()
        yield store if has else None
    finally:
        store.conn.close()


# -- the periodic job ------------------------------------------------------------------------------
class PruneJob:
    """Runs `prune` in a worker thread at start and then every `interval_s` seconds, in the
    workbench's event loop, until `stop`. A failed prune is logged and tried again at the next
    interval."""

    STOP_WAIT_S = 10.0  # how long `stop` lets a prune in progress finish before cancelling it

    def __init__(self, engine: Engine, settings: WorkbenchSettings) -> None:
        self.engine, self.settings = engine, settings
        self.policy = RetentionPolicy.of(settings)
        self.task: asyncio.Task | None = None
        self.reports: list[PruneReport] = []  # the latest few, newest last
        self._stopping = asyncio.Event()

    def start(self) -> None:
        """Start the job (nothing when `prune_interval_s` is 0)."""
        if self.settings.prune_interval_s > 0 and self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._loop(), name="arbor-prune")

    async def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                report = await asyncio.to_thread(prune, self.engine, self.settings, self.policy)
                self.reports = [*self.reports[-9:], report]
                if report.total:
                    log.info("pruned: %s", report.summary(self.policy))
            except Exception:  # keep the workbench up; the next interval tries again
                log.exception("prune failed")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.settings.prune_interval_s)

    async def stop(self) -> None:
        """Stop the job, letting a prune in progress finish (its worker thread uses the database
        that closes next) for up to STOP_WAIT_S."""
        if self.task is None:
            return
        self._stopping.set()
        done, _ = await asyncio.wait({self.task}, timeout=self.STOP_WAIT_S)
        if not done:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        self.task = None
