"""A redis-server as a plain process for benchmarks and tests of the shared KV tier: a free
port, no persistence, a bounded `maxmemory` with allkeys-lru (the policy tier R relies on:
the store, not Arbor, decides what it keeps)."""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from harness.serving.ports import free_port

# The deployment secret that benchmarks and tests give every replica of a store
# (--cache-shared-secret): fixed, since the store is a throwaway process on loopback.
SHARED_SECRET = "arbor-bench-shared-secret-0123456789"


@dataclass
class RedisStore:
    port: int
    proc: subprocess.Popen
    log: Path

    secret: str = SHARED_SECRET

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def redis_server() -> str | None:
    """The redis-server binary (Debian package redis-server), or None."""
    return shutil.which("redis-server")


def start_redis(tmp_dir: Path, maxmemory: str = "64mb") -> RedisStore:
    """Start redis-server and wait until it answers PING (RuntimeError with its log if not)."""
    import redis

    exe = redis_server()
    if exe is None:
        raise RuntimeError("redis-server is not installed (Debian package redis-server: scripts/setup.sh --test-tools)")
    port = free_port()
    log = tmp_dir / f"redis-{port}.log"
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--maxmemory", maxmemory, "--maxmemory-policy", "allkeys-lru", "--dir", str(tmp_dir)],
                            stdout=log.open("w"), stderr=subprocess.STDOUT)
    client = redis.Redis(port=port, socket_timeout=1)
    deadline = time.monotonic() + 20
    try:
        while True:
            try:
                client.ping()
                return RedisStore(port, proc, log)
            except redis.exceptions.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    proc.kill()
                    raise RuntimeError(f"redis-server did not start: {log.read_text()[-2000:]}") from None
                time.sleep(0.05)
    finally:
        client.close()
