"""A real redis-server for the shared tier's tests: a subprocess on a free port, no
persistence, a small maxmemory with allkeys-lru (the policy the tier relies on)."""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.servers import free_port


@dataclass
class RedisStore:
    port: int
    proc: subprocess.Popen
    log: Path

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def start_redis(tmp_dir: Path, maxmemory: str = "64mb") -> RedisStore:
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not installed (Debian package redis-server: scripts/setup.sh --test-tools)")
    pytest.importorskip("redis", reason="PyPI redis is not installed (pip install -e '.[scale]')")
    import redis

    port = free_port()
    log = tmp_dir / f"redis-{port}.log"
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--maxmemory", maxmemory, "--maxmemory-policy", "allkeys-lru", "--dir", str(tmp_dir)],
                            stdout=log.open("w"), stderr=subprocess.STDOUT)
    client = redis.Redis(port=port, socket_timeout=1)
    deadline = time.monotonic() + 20
    while True:
        try:
            client.ping()
            break
        except redis.exceptions.ConnectionError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"redis-server did not start: {log.read_text()[-2000:]}")
            time.sleep(0.05)
    client.close()
    return RedisStore(port, proc, log)
