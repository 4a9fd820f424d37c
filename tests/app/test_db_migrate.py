"""A workbench opened on a database made before some columns or indexes existed adds them
(app/db/migrate.py)."""

import pytest
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError

from app.db.engine import make_engine
from app.db.models import ONE_ACTIVE_TURN_INDEX
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


def test_the_one_active_turn_index_is_added_and_holds_the_branch(tmp_path):
    settings = make_settings(tmp_path, "http://placeholder/v1")
    settings.ensure_data_dir()
    engine = make_engine(settings.database_url)
    with engine.begin() as conn:  # as a workbench made it before the index existed
        conn.execute(text(f"DROP INDEX {ONE_ACTIVE_TURN_INDEX}"))
        conn.execute(text("INSERT INTO sessions (id, scenario, title, created_at) "
                          "VALUES ('s1', 'lab', '', CURRENT_TIMESTAMP)"))
        conn.execute(text("INSERT INTO branches (id, session_id, name, created_at) "
                          "VALUES ('b1', 's1', 'main', CURRENT_TIMESTAMP)"))
    engine.dispose()

    engine = make_engine(settings.database_url)
    assert ONE_ACTIVE_TURN_INDEX in {i["name"] for i in inspect(engine).get_indexes("turns")}

    def turn(turn_id: str, status: str) -> None:
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO turns (id, session_id, branch_id, depth, status, user_message, created_at) "
                              "VALUES (:id, 's1', 'b1', 0, :status, 'hi', CURRENT_TIMESTAMP)"),
                         {"id": turn_id, "status": status})

    turn("t1", "completed")
    turn("t2", "completed")  # ended turns: as many as the branch has
    turn("t3", "running")
    for status in ("running", "awaiting_approval"):  # a second active turn: refused by the database
        with pytest.raises(IntegrityError):
            turn("t4", status)
    engine.dispose()
