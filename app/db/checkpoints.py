"""The LangGraph checkpointer, kept where `DATABASE_URL` says the workbench's data lives.

PostgreSQL: `AsyncPostgresSaver` on a small psycopg connection pool, its tables in the same
database as the workbench's (created or migrated when the workbench opens). SQLite:
`AsyncSqliteSaver` on `settings.checkpoint_path`, its tables created when the workbench opens.

A checkpoint thread belongs to one branch (`branch_thread_id`, "branch-<branch id>"): its
turns run one after another on it, each from an explicit checkpoint (app/services/turns.py,
app/services/branch_threads.py). A branch's thread is deleted with the branch, a session's
threads with the session (`delete_threads`). Turns recorded before that design ran on a
thread of their own ("turn-<turn id>", still named by `Run.thread_id`), deleted alike.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

from app.db.urls import is_postgres, libpq_url
from app.settings import WorkbenchSettings

# Turns of different sessions checkpoint concurrently; a few connections serve them, and the
# pool replaces a connection that died (a restarted server) instead of failing every later turn.
POOL_MIN_SIZE = 1
POOL_MAX_SIZE = 4


def branch_thread_id(branch_id: str) -> str:
    """The LangGraph thread of a branch."""
    return f"branch-{branch_id}"


@asynccontextmanager
async def open_checkpointer(settings: WorkbenchSettings) -> AsyncIterator[BaseCheckpointSaver]:
    """The checkpointer for `settings.database_url`, ready to use; closed on exit.

    An unreachable PostgreSQL fails here, at start-up, not at the first turn.
    """
    if is_postgres(settings.database_url):
        async with _postgres_saver(libpq_url(settings.database_url)) as saver:
            yield saver
        return
    path = settings.checkpoint_path
    assert path is not None  # a SQLite database always has a checkpoint file
    path.parent.mkdir(parents=True, exist_ok=True)
    async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
        # Its tables now, as for PostgreSQL: the saver creates them on its first read or write,
        # but not before a delete (a session deleted before any turn ran: "no such table", 500).
        await saver.setup()
        yield saver


@asynccontextmanager
async def _postgres_saver(conninfo: str) -> AsyncIterator[BaseCheckpointSaver]:
    # Imported here: psycopg loads libpq, which a SQLite-only workbench never needs.
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg import AsyncConnection
    from psycopg.rows import DictRow, dict_row
    from psycopg_pool import AsyncConnectionPool

    # The connection settings AsyncPostgresSaver.from_conn_string uses: it commits each
    # statement itself, reads rows as dicts, and prepared statements do not survive poolers.
    pool = AsyncConnectionPool(conninfo, min_size=POOL_MIN_SIZE, max_size=POOL_MAX_SIZE, open=False,
                               connection_class=AsyncConnection[DictRow],
                               kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
                               check=AsyncConnectionPool.check_connection)
    await pool.open(wait=True, timeout=30)
    try:
        saver = AsyncPostgresSaver(pool)
        await saver.setup()
        yield saver
    finally:
        await pool.close()


async def delete_threads(checkpointer: BaseCheckpointSaver, thread_ids: Iterable[str]) -> None:
    """Delete every checkpoint and pending write of each thread (idempotent: an unknown or
    already deleted thread is no error)."""
    for thread_id in thread_ids:
        await checkpointer.adelete_thread(thread_id)
