"""Which workbench process runs a turn, and whether that process is still alive.

Several workbench processes may share one PostgreSQL. Each holds, for its whole life, a
PostgreSQL session-level advisory lock named by its own id, on a connection of its own: the
database releases it when the process's connection goes, however the process ended (kill -9,
power loss). A run records the id of the process that runs it (`runs.owner`); at start-up a
process fails only the running turns whose owner's lock is free, never a turn another live
process is running. On SQLite (one workbench process per database file) every other owner is
taken for dead, as before.
"""

from __future__ import annotations

import hashlib
import os
import socket
import uuid

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine


def lock_key(owner: str) -> int:
    """The advisory lock's key (a signed 64-bit int, as pg_advisory_lock takes) for `owner`."""
    digest = hashlib.blake2b(f"arbor-workbench:{owner}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class ProcessLiveness:
    """This process's id (`owner`) and, on PostgreSQL, the lock that says it is alive."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._held: Connection | None = None
        if engine.dialect.name == "postgresql":
            self._held = engine.connect()
            self._held.execute(text("SELECT pg_advisory_lock(:k)"), {"k": lock_key(self.owner)})
            self._held.commit()  # a session-level lock outlives the transaction; the connection stays open

    def alive(self, owner: str | None) -> bool:
        """Whether the process `owner` still runs (None: a run recorded before owners were: dead)."""
        if owner is None:
            return False
        if owner == self.owner:
            return True
        if self._held is None:
            return False
        with self.engine.connect() as conn:
            key = {"k": lock_key(owner)}
            if conn.execute(text("SELECT pg_try_advisory_lock(:k)"), key).scalar():
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), key)
                return False
            return True

    def close(self) -> None:
        if self._held is not None:
            self._held.close()
            self._held = None
