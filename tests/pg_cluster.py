"""A throwaway PostgreSQL cluster for the tests: Debian's `postgresql` package, its own data
directory in a temporary directory, a free port on 127.0.0.1, its socket in that directory.

`find_bindir()` says where initdb / pg_ctl are (None: the package is missing, the tests skip
with that reason, and under CI=true the skip fails the run). `TempCluster` runs them; PostgreSQL
refuses to run as root, so as root they run as the `postgres` user the package creates, and
the temporary directory belongs to that user.

The cluster trusts local connections (it lives only as long as the test session) and runs
with fsync off: a crash loses nothing the tests need, and every commit stays cheap.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

from harness.serving.ports import free_port

SUPERUSER = "arbor"
OS_USER_FOR_ROOT = "postgres"  # created by Debian's postgresql-common
DEBIAN_BINDIRS = Path("/usr/lib/postgresql")


def find_bindir() -> Path | None:
    """The directory of initdb and pg_ctl: $ARBOR_PG_BIN, else the newest
    /usr/lib/postgresql/<version>/bin (Debian keeps them off PATH), else initdb's on PATH."""
    if os.environ.get("ARBOR_PG_BIN"):
        candidates = [Path(os.environ["ARBOR_PG_BIN"])]
    else:
        versions = sorted((p for p in DEBIAN_BINDIRS.glob("*/bin") if p.parent.name.isdigit()),
                          key=lambda p: int(p.parent.name), reverse=True)
        on_path = shutil.which("initdb")
        candidates = [*versions, *([Path(on_path).parent] if on_path else [])]
    for bindir in candidates:
        if all(os.access(bindir / tool, os.X_OK) for tool in ("initdb", "pg_ctl", "postgres")):
            return bindir
    return None


def unavailable_reason() -> str | None:
    """Why a cluster cannot be started here, or None when it can."""
    if find_bindir() is None:
        return ("PostgreSQL is not installed (Debian package postgresql; scripts/setup.sh --test-tools "
                "installs it, or point ARBOR_PG_BIN at the directory of initdb and pg_ctl)")
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            return "running as root, and PostgreSQL refuses root, but runuser is missing to switch users"
        try:
            import pwd
            pwd.getpwnam(OS_USER_FOR_ROOT)
        except KeyError:
            return f"running as root, and PostgreSQL refuses root, but there is no {OS_USER_FOR_ROOT!r} user"
    return None


class TempCluster:
    """initdb + pg_ctl start on a temporary directory; `stop()` stops it and removes the directory."""

    def __init__(self) -> None:
        bindir = find_bindir()
        if bindir is None:
            raise RuntimeError(unavailable_reason())
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="arbor-pg-"))
        self.data = self.root / "data"
        self.port = 0
        self._as_root = os.geteuid() == 0
        if self._as_root:
            shutil.chown(self.root, OS_USER_FOR_ROOT, OS_USER_FOR_ROOT)

    # -- lifecycle --------------------------------------------------------------------------
    def start(self, attempts: int = 3) -> TempCluster:
        self._run("initdb", "-D", self.data, "-U", SUPERUSER, "--auth=trust", "-E", "UTF8",
                  "--locale=C", "--no-sync")
        # A free port can be taken between choosing and binding it (other test sessions share
        # the machine); pg_ctl then fails, and another port is tried.
        for attempt in range(attempts):
            self.port = free_port()
            options = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
                       "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
            try:
                self._run("pg_ctl", "-D", self.data, "-l", self.root / "server.log", "-w", "-t", "60",
                          "-o", options, "start")
                return self
            except ToolFailed as exc:
                if attempt == attempts - 1:
                    raise RuntimeError(f"PostgreSQL did not start: {exc}\nits log:\n{self.log()}") from None
        return self

    def stop(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self._run("pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def log(self) -> str:
        path = self.root / "server.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else "(no log)"

    # -- databases --------------------------------------------------------------------------
    def url(self, database: str = "postgres") -> str:
        """A DATABASE_URL for `database` (TCP on 127.0.0.1, as a deployment would connect)."""
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        """A new empty database; returns its name."""
        name = f"t_{uuid.uuid4().hex[:12]}"
        self.admin(f'CREATE DATABASE "{name}"')
        return name

    def drop_database(self, name: str) -> None:
        # FORCE ends connections a test left open (pools close asynchronously).
        self.admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def admin(self, sql: str) -> None:
        import psycopg
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(sql)

    def query(self, database: str, sql: str, *params) -> list[tuple]:
        import psycopg
        with psycopg.connect(self.url(database)) as conn:
            return conn.execute(sql, params).fetchall()

    # -- helpers ----------------------------------------------------------------------------
    def _run(self, tool: str, *args) -> None:
        command = [str(self.bindir / tool), *map(str, args)]
        if self._as_root:
            command = ["runuser", "-u", OS_USER_FOR_ROOT, "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=self.root)
        if done.returncode != 0:
            raise ToolFailed(f"{tool} exited {done.returncode}:\n{done.stdout}{done.stderr}")


class ToolFailed(RuntimeError):
    """initdb or pg_ctl exited non-zero; the message carries its output."""
