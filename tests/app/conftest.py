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

A test fails when a workbench answered it with a 5xx it did not expect (tests/app/server_errors.py):
mark a test that provokes one `@pytest.mark.expects_5xx`, or wrap the request in `expected_5xx()`.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from app.settings import WorkbenchSettings
from tests.app import server_errors
from tests.app.server_errors import SERVER_ERRORS
from tests.pg_cluster import TempCluster, unavailable_reason

DATABASES = ("sqlite", "postgresql")

server_errors.install()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{server_errors.MARKER}: the test provokes a 5xx from a workbench on purpose")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """Fail the test with the 5xx answers a workbench gave it, unless it expects them."""
    SERVER_ERRORS.reset()
    result = yield
    seen = list(SERVER_ERRORS.seen)
    if seen and item.get_closest_marker(server_errors.MARKER) is None:
        listed = "\n  ".join(seen[:10])
        raise AssertionError(f"a workbench answered {len(seen)} request(s) with a 5xx the test did not expect "
                             f"(mark it @pytest.mark.{server_errors.MARKER} if it should):\n  {listed}")
    return result


@pytest.fixture
def expected_5xx():
    """`with expected_5xx(): ...`: the 5xx answers inside the block are expected."""
    return SERVER_ERRORS.expected


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
