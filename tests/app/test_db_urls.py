"""One DATABASE_URL, read by SQLAlchemy (tables) and by psycopg / aiosqlite (checkpoints)."""

from pathlib import Path

import pytest

from app.db.urls import is_postgres, libpq_url, sqlalchemy_url, sqlite_path
from app.settings import WorkbenchSettings


@pytest.mark.parametrize("url,engine_url,conninfo", [
    # a driverless URL gets psycopg 3 (psycopg2 is not installed), the password kept
    ("postgresql://arbor:s%40cret@db:5432/arbor", "postgresql+psycopg://arbor:s%40cret@db:5432/arbor",
     "postgresql://arbor:s%40cret@db:5432/arbor"),
    # an explicit driver is SQLAlchemy's business; libpq gets the plain scheme
    ("postgresql+psycopg://u@h/d?sslmode=require", "postgresql+psycopg://u@h/d?sslmode=require",
     "postgresql://u@h/d?sslmode=require"),
])
def test_postgres_urls(url, engine_url, conninfo):
    assert is_postgres(url)
    assert sqlalchemy_url(url) == engine_url
    assert libpq_url(url) == conninfo
    assert sqlite_path(url) is None


def test_sqlite_urls():
    assert not is_postgres("sqlite:////data/arbor.db")
    assert sqlalchemy_url("sqlite:////data/arbor.db") == "sqlite:////data/arbor.db"
    assert sqlite_path("sqlite:////data/arbor.db") == Path("/data/arbor.db")
    assert sqlite_path("sqlite:///:memory:") is None and sqlite_path("sqlite://") is None
    with pytest.raises(ValueError, match="not a PostgreSQL URL"):
        libpq_url("sqlite:////data/arbor.db")


def test_checkpoints_follow_the_database(tmp_path):
    def checkpoint_path(url):
        return WorkbenchSettings(_env_file=None, data_dir=tmp_path / "d", database_url=url).checkpoint_path

    assert checkpoint_path("") == tmp_path / "d" / "checkpoints.sqlite"  # the default, as it always was
    assert checkpoint_path(f"sqlite:///{tmp_path}/elsewhere/wb.db") == tmp_path / "elsewhere" / "checkpoints.sqlite"
    assert checkpoint_path("sqlite:///:memory:") == tmp_path / "d" / "checkpoints.sqlite"
    assert checkpoint_path("postgresql://u@h/d") is None  # tables of that same database
