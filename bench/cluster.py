"""N arbor-servers behind one cache-aware router (SMG), started as plain processes.

    python -m bench.cluster [--replicas 2] [--policy cache_aware] [--port 8000] [--threads 1]
        [--shared [--shared-maxmemory 1gb]] [--router-arg=--cache-threshold=0.5 ...] [-- arbor-server args...]

prints the router's URL and runs until Ctrl-C. The tests and benchmarks use the same
context managers (`replicas`, `router`), so what they measure is what this starts.

The router is SMG (PyPI `smg`, the `scale` extra; the successor of SGLang's router). It
needs nothing Arbor-specific: arbor-server answers `GET /version`, so SMG classifies it as a
vLLM-compatible worker and reads its load from `/metrics` under vLLM's names
(server/api/http/vllm_metrics.py). Health is probed every second and one failure takes a replica
out, so a dead replica stops receiving requests within about a second; requests that hit it
meanwhile are retried on another (SMG's retries). Every request must name the served model
(SMG routes by model id: give every replica the same `--alias`). With `--shared`, a
redis-server (harness/serving/redis_store.py) is started first and every replica gets `--cache-shared`
(the shared KV tier R: a prefix computed on one replica is restored on another).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx

from harness.serving.redis_store import start_redis
from harness.serving.servers import Server, arbor_command, free_port, running

# Failover in about a second instead of SMG's defaults (60 s health interval, 3 failures).
SMG_FAST_FAILOVER = ("--health-check-interval-secs", "1", "--health-failure-threshold", "1",
                     "--health-success-threshold", "1", "--health-check-timeout-secs", "2")


def smg_command(port: int, worker_urls: Sequence[str], policy: str, extra: Sequence[str] = ()) -> list[str]:
    """SMG's launcher in this interpreter (so the `smg` of this venv), on loopback, with its
    Prometheus listener on a free loopback port (its default 0.0.0.0:29000 would collide
    between two routers and open a port to the network)."""
    return [sys.executable, "-m", "smg.launch_router", "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *worker_urls, "--policy", policy,
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
            "--shutdown-grace-period-secs", "2", *SMG_FAST_FAILOVER, *extra]


def wait_workers_ready(router_url: str, n: int, timeout: float = 120.0) -> None:
    """SMG answers /health before it has registered its workers: wait until `/workers`
    lists n of them healthy and ready."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = httpx.get(router_url + "/workers", timeout=5).json()
            ready = [w for w in last.get("workers", []) if w.get("is_healthy") and w.get("status") == "ready"]
            if len(ready) >= n:
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.3)
    raise RuntimeError(f"the router at {router_url} did not register {n} ready workers: {last}")


@contextmanager
def replicas(n: int, server_args: Sequence[str], log_dir: Path, model: Path | None = None,
             name: str = "replica") -> Iterator[list[Server]]:
    """n arbor-servers with the same arguments on free loopback ports, stopped on exit."""
    with ExitStack() as stack:
        servers = []
        for i in range(n):
            port = free_port()
            servers.append(stack.enter_context(
                running(f"{name}-{i}", arbor_command(port, model, list(server_args)), port, log_dir)))
        yield servers


@contextmanager
def router(worker_urls: Sequence[str], log_dir: Path, policy: str = "cache_aware",
           extra: Sequence[str] = (), name: str | None = None) -> Iterator[Server]:
    """SMG in front of worker_urls, ready once it has registered every worker."""
    port = free_port()
    with running(name or f"smg-{policy}", smg_command(port, worker_urls, policy, extra), port, log_dir) as srv:
        wait_workers_ready(srv.base_url, len(worker_urls))
        yield srv


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    server_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, server_args = argv[:cut], argv[cut + 1:]
    p = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--policy", default="cache_aware", help="SMG --policy (cache_aware, round_robin, ...)")
    p.add_argument("--port", type=int, default=8000, help="the router's port")
    p.add_argument("--threads", type=int, default=1, help="arbor-server --threads of each replica")
    p.add_argument("--model", type=Path, default=None)
    p.add_argument("--router-arg", action="append", default=[], help="extra SMG argument (repeatable)")
    p.add_argument("--log-dir", type=Path, default=Path("var/logs/cluster"))
    p.add_argument("--shared", action="store_true", help="start a redis-server and give every replica "
                   "--cache-shared (the shared KV tier)")
    p.add_argument("--shared-maxmemory", default="1gb", help="the store's maxmemory (allkeys-lru)")
    a = p.parse_args(argv)
    if a.replicas < 1:
        p.error("--replicas must be at least 1")
    args = ["--threads", str(a.threads), *server_args]
    with ExitStack() as stack:
        if a.shared:
            a.log_dir.mkdir(parents=True, exist_ok=True)
            store = start_redis(a.log_dir, a.shared_maxmemory)
            stack.callback(store.stop)
            args += ["--cache-shared", store.url, "--cache-shared-secret", store.secret]
            print(f"shared KV store {store.url} (log: {store.log})", flush=True)
        _serve(a, args)


def _serve(a: argparse.Namespace, args: list[str]) -> None:
    with replicas(a.replicas, args, a.log_dir, a.model) as servers:
        urls = [s.base_url for s in servers]
        with running("smg", smg_command(a.port, urls, a.policy, a.router_arg), a.port, a.log_dir) as srv:
            wait_workers_ready(srv.base_url, len(urls))
            print(f"router {srv.base_url}/v1 -> {' '.join(urls)} (logs: {a.log_dir})", flush=True)
            signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop as on Ctrl-C: the exits run
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass


if __name__ == "__main__":
    main()
