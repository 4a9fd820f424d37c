"""The workbench's database-backed tests run on SQLite and on PostgreSQL.

A test (or a module, through `pytestmark = pytest.mark.usefixtures("workbench_database")`)
that uses `workbench_database` runs once per database, with ids `[sqlite]` and
`[postgresql]`. The database reaches the app the way a deployment configures it, through
DATABASE_URL, which `make_settings` leaves to the environment: unset for SQLite (the default
file in the test's data dir), a fresh database of the session's own PostgreSQL cluster
(tests/pg_cluster.py) for PostgreSQL, dropped after the test. `module_database` is the same
for a module-scoped app.

Without PostgreSQL installed the `[postgresql]` cases skip, naming the package; under CI=true
that skip fails the run (tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from app.settings import WorkbenchSettings
from tests.pg_cluster import TempCluster, unavailable_reason

DATABASES = ("sqlite", "postgresql")

# The tables where each LangGraph checkpointer keeps a thread's state.
_CHECKPOINT_TABLES = {"sqlite": ("checkpoints", "writes"),
                      "postgresql": ("checkpoints", "checkpoint_blobs", "checkpoint_writes")}


@dataclass
class WorkbenchDatabase:
    """The database a test's workbench uses; `cluster` and `name` are set for PostgreSQL."""

    kind: str
    cluster: TempCluster | None = None
    name: str | None = None

    def checkpoint_threads(self, settings: WorkbenchSettings) -> set[str]:
        """Thread ids that have any checkpoint data, read straight from the store (not through
        the app), so a checkpointer writing somewhere else would show up as missing here."""
        selects = " UNION ".join(f"SELECT thread_id FROM {t}" for t in _CHECKPOINT_TABLES[self.kind])
        if self.cluster is not None:
            return {row[0] for row in self.cluster.query(self.name, selects)}
        assert settings.checkpoint_path is not None and settings.checkpoint_path.exists()
        with contextlib.closing(sqlite3.connect(settings.checkpoint_path)) as conn:
            return {row[0] for row in conn.execute(selects)}


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[TempCluster]:
    """The session's own PostgreSQL cluster (temporary directory, free port), removed at the end."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    cluster = TempCluster().start()
    try:
        yield cluster
    finally:
        cluster.stop()


@contextlib.contextmanager
def _database(kind: str, request: pytest.FixtureRequest) -> Iterator[WorkbenchDatabase]:
    with pytest.MonkeyPatch.context() as env:
        if kind == "sqlite":
            env.delenv("DATABASE_URL", raising=False)
            yield WorkbenchDatabase("sqlite")
            return
        cluster: TempCluster = request.getfixturevalue("postgres_cluster")
        name = cluster.create_database()
        env.setenv("DATABASE_URL", cluster.url(name))
        try:
            yield WorkbenchDatabase("postgresql", cluster, name)
        finally:
            cluster.drop_database(name)


@pytest.fixture(params=DATABASES)
def workbench_database(request: pytest.FixtureRequest) -> Iterator[WorkbenchDatabase]:
    with _database(request.param, request) as database:
        yield database


@pytest.fixture(scope="module", params=DATABASES)
def module_database(request: pytest.FixtureRequest) -> Iterator[WorkbenchDatabase]:
    with _database(request.param, request) as database:
        yield database
