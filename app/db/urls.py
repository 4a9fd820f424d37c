"""What `DATABASE_URL` means to each client of the database.

One URL configures both the workbench tables (SQLAlchemy) and the LangGraph checkpoints:
- `sqlite:///path` — tables in that file, checkpoints in `checkpoints.sqlite` beside it;
- `postgresql://...` — tables and checkpoints in that one database, both through psycopg 3
  (`postgresql+psycopg://` and the other `postgresql+<driver>://` spellings are accepted; the
  driver part is SQLAlchemy's and means nothing to libpq).
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import make_url

MEMORY = ":memory:"


def is_postgres(database_url: str) -> bool:
    return make_url(database_url).get_backend_name() == "postgresql"


def sqlalchemy_url(database_url: str) -> str:
    """The URL for `create_engine`: plain `postgresql://` gets the psycopg 3 driver.

    SQLAlchemy would pick psycopg2 for a driverless URL; the checkpointer needs psycopg 3, and
    one driver is one dependency less.
    """
    url = make_url(database_url)
    if url.drivername == "postgresql":
        url = url.set(drivername="postgresql+psycopg")
    return url.render_as_string(hide_password=False)


def libpq_url(database_url: str) -> str:
    """The same PostgreSQL database as a libpq connection URI (what psycopg connects with)."""
    url = make_url(database_url)
    if url.get_backend_name() != "postgresql":
        raise ValueError(f"not a PostgreSQL URL: {url.render_as_string()}")
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


def sqlite_path(database_url: str) -> Path | None:
    """The SQLite database file; None for PostgreSQL and for an in-memory SQLite database."""
    url = make_url(database_url)
    if url.get_backend_name() != "sqlite" or url.database in (None, "", MEMORY):
        return None
    return Path(url.database)
