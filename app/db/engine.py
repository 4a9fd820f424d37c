"""Database engine creation: SQLite file by default, PostgreSQL (through psycopg 3) otherwise."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from sqlalchemy import CursorResult, Result, event
from sqlalchemy.engine import Engine
from sqlmodel import SQLModel, create_engine

from app.db import models  # noqa: F401  (registers the tables on SQLModel.metadata)
from app.db.migrate import add_missing_columns, add_missing_indexes
from app.db.urls import sqlalchemy_url


def make_engine(database_url: str) -> Engine:
    """Create the engine and the tables (idempotent; columns added since are added to old
    tables: app/db/migrate.py). SQLite gets WAL and foreign keys on."""
    if database_url.startswith("sqlite"):
        path = database_url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        # The API serves from one event loop but runs stream in background tasks; SQLite
        # connections may therefore be used from more than one thread.
        engine = create_engine(database_url, connect_args={"check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_connection, _record) -> None:  # pragma: no cover - trivial
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()
    else:
        engine = create_engine(sqlalchemy_url(database_url), pool_pre_ping=True)
    SQLModel.metadata.create_all(engine)
    add_missing_columns(engine)
    add_missing_indexes(engine)
    return engine


def affected_rows(result: Result[Any]) -> int:
    """How many rows an UPDATE or DELETE changed (Session.execute's result is typed as the generic
    Result; for those statements it is a CursorResult)."""
    return cast(CursorResult[Any], result).rowcount
