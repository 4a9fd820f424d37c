"""Columns added to existing tables since a database was created.

`SQLModel.metadata.create_all` creates missing tables but never alters existing ones; a
workbench opened on an older database adds here the nullable columns its tables lack
(`ALTER TABLE ... ADD COLUMN`, the same statement on SQLite and PostgreSQL). Only nullable
columns are ever added this way, so rows written before read as NULL ("not recorded").
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
