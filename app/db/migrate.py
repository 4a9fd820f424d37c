"""Columns and indexes added to existing tables since a database was created.

`SQLModel.metadata.create_all` creates missing tables but never alters existing ones; a
workbench opened on an older database adds here the nullable columns its tables lack
(`ALTER TABLE ... ADD COLUMN`, the same statement on SQLite and PostgreSQL). Only nullable
columns are ever added this way, so rows written before read as NULL ("not recorded").
Indexes declared since (`add_missing_indexes`) are created the same way.
"""

from __future__ import annotations

from sqlalchemy import inspect, text
from sqlalchemy.engine import Engine
from sqlmodel import SQLModel


def add_missing_columns(engine: Engine) -> list[str]:
    """Add each nullable model column its table lacks; returns "table.column" of those added."""
    inspector = inspect(engine)
    added: list[str] = []
    with engine.begin() as conn:
        for table in SQLModel.metadata.sorted_tables:
            present = {c["name"] for c in inspector.get_columns(table.name)}
            for column in table.columns:
                if column.name in present:
                    continue
                if not column.nullable:  # a NOT NULL column needs a real migration with a default
                    raise RuntimeError(f"{table.name}.{column.name} is missing and not nullable")
                kind = column.type.compile(dialect=engine.dialect)
                conn.execute(text(f'ALTER TABLE {table.name} ADD COLUMN "{column.name}" {kind}'))
                added.append(f"{table.name}.{column.name}")
    return added


def add_missing_indexes(engine: Engine) -> list[str]:
    """Create each declared index its table lacks (`create_all` makes them only with a new
    table); returns their names. A unique index that the rows already break is refused with
    the database's own message: a person must settle those rows first."""
    inspector = inspect(engine)
    added: list[str] = []
    with engine.begin() as conn:
        for table in SQLModel.metadata.sorted_tables:
            present = {i["name"] for i in inspector.get_indexes(table.name)}
            for index in table.indexes:
                if index.name not in present:
                    index.create(conn)
                    added.append(str(index.name))
    return added
