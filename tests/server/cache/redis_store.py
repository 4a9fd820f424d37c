"""The shared tier's tests' redis-server (harness/serving/redis_store.py), skipped with the package to
install when redis-server or PyPI redis is missing (CI=true turns the skip into a failure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.serving.redis_store import RedisStore, redis_server
from harness.serving.redis_store import start_redis as _start


def start_redis(tmp_dir: Path, maxmemory: str = "64mb") -> RedisStore:
    if redis_server() is None:
        pytest.skip("redis-server is not installed (Debian package redis-server: scripts/setup.sh --test-tools)")
    pytest.importorskip("redis", reason="PyPI redis is not installed (run scripts/setup.sh)")
    return _start(tmp_dir, maxmemory)
