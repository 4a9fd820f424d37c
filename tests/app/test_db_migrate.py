"""A workbench opened on a database made before some columns existed adds them (app/db/migrate.py)."""

import pytest
from sqlalchemy import inspect, text

from app.db.engine import make_engine
from tests.app.support import make_settings

pytestmark = pytest.mark.usefixtures("workbench_database")  # on SQLite and PostgreSQL

NEW = {"turns": ("start_checkpoint_id", "end_checkpoint_id"),
       "branches": ("fork_checkpoint_id", "base_checkpoint_id")}


def test_missing_nullable_columns_are_added_and_old_rows_read_null(tmp_path):
    settings = make_settings(tmp_path, "http://placeholder/v1")
    settings.ensure_data_dir()
    engine = make_engine(settings.database_url)
    with engine.begin() as conn:  # the tables as an older workbench made them, with a row
        for table, columns in NEW.items():
            for column in columns:
                conn.execute(text(f"ALTER TABLE {table} DROP COLUMN {column}"))
        conn.execute(text("INSERT INTO sessions (id, scenario, title, created_at) "
                          "VALUES ('s1', 'lab', '', CURRENT_TIMESTAMP)"))
        conn.execute(text("INSERT INTO branches (id, session_id, name, created_at) "
                          "VALUES ('b1', 's1', 'main', CURRENT_TIMESTAMP)"))
    engine.dispose()

    engine = make_engine(settings.database_url)  # opened again: the columns come back
    for table, columns in NEW.items():
        assert set(columns) <= {c["name"] for c in inspect(engine).get_columns(table)}
    with engine.connect() as conn:
        row = conn.execute(text("SELECT fork_checkpoint_id, base_checkpoint_id FROM branches")).one()
    assert tuple(row) == (None, None)
    engine.dispose()
