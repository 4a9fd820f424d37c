"""Soak: mixed traffic against one arbor-server for a bounded time and count, loopback only.

    python -m bench.soak [--duration-s 1800] [--max-requests 100000] [--parallel 2] [--out bench/results/soak.json]

Traffic runs at 2x the slot count (so requests queue all the time) and mixes three kinds:
agent sessions (a shared system prompt, growing history, cache hints in headers, and now and
then a branch: an earlier point of the session continued differently), shared-prefix requests
(one long preamble, a different question each) and unique prompts. 10% of the clients give
up: half of them stream and close the connection right after the first chunk, half ask for a
whole answer and close the connection before it comes. The cache runs all four tiers
(A,S,H,D) on small budgets, so eviction and disk writes never stop, and forgets sessions
idle for 5 minutes (`--cache-session-idle 300`), as an agent's sessions come and go.

Reported (JSON at --out, and a line per figure on stdout): requests by status, 5xx (must be 0),
client errors, streams cut and whole answers abandoned, p50/p99 time to first token, the
server's RSS and the size of its session registry at start, half-way and end (sampled all
along: `samples`, with the bytes each tier really holds — the host tier's buffers, the disk
tier's files as `ls` sees them, the KV queued for the disk writer — against its budget, and
the slots busy once every client has gone; the KV buffer's pages and the host tier's budget fill
during the first part of a run, so a leak shows as growth over the second half), KV
cells held at rest at start and end (slots from llama.cpp's own positions via /slots, resident
owners from /metrics, and llama.cpp's count of cells in use: never more than those holders
account for, or cells leaked), the same after POST /cache/flush (only the slots' kept
prefixes remain), disk files vs. the disk tier's index, cache fallbacks. `soak()` is the
same run as a function, for the test suite's short version.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import statistics
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from harness.serving import sse
from harness.serving.servers import arbor_command, free_port, running

WORDS = ("pump valve sensor alarm shift report pressure flow tank motor fan belt filter relay switch panel cable "
         "bearing seal gauge meter line crew ticket").split()
SYSTEM = ("You are the assistant of an edge maintenance team. Answer briefly, cite device ids, never invent "
          "telemetry. Devices: pump-1, pump-2, compressor-7, fan-3, relay-9. Shifts: day and night.")
PREAMBLE = "Maintenance handbook, chapter 4. " + " ".join(WORDS * 6)


@dataclass
class SoakResult:
    duration_s: float
    requests: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    by_status: dict[str, int] = field(default_factory=dict)
    server_errors: int = 0  # 5xx
    client_errors: int = 0  # connection failures, timeouts
    streams_cut: int = 0
    answers_abandoned: int = 0  # non-streamed requests whose client closed the connection first
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    rss_start_mib: float = 0.0
    rss_mid_mib: float = 0.0  # half-way through the traffic
    rss_end_mib: float = 0.0
    rss_growth_second_half_pct: float = 0.0
    registry_mid: float = 0.0  # sessions the server remembers, half-way
    registry_end: float = 0.0
    registry_growth_second_half_pct: float = 0.0
    samples: list[dict] = field(default_factory=list)  # RSS, registry, bytes held per tier, over time
    budget_violations: int = 0  # samples where a tier held more than its budget
    requests_abandoned: float = 0.0  # the server's count of generations stopped because the client left
    busy_slots_after_clients_left: int = 0
    kv_start: dict = field(default_factory=dict)
    kv_end: dict = field(default_factory=dict)
    kv_flushed: dict = field(default_factory=dict)  # at rest after POST /cache/flush
    disk_files: int = 0
    disk_index_entries: int = 0  # index ranges; several may share one file after splits
    disk_index_files: int = 0  # distinct files the index uses
    fallbacks: float = 0.0
    server_alive: bool = True


def server_args(parallel: int, cache_dir: Path) -> list[str]:
    """Small budgets: a few segments fill the host tier and the disk tier, so both evict."""
    return ["--parallel", str(parallel), "--ctx-size", str(parallel * 2048), "--batch-size", "128", "--threads", "2",
            "--max-queue", str(4 * parallel), "--cache-tiers", "A,S,H,D", "--cache-dir", str(cache_dir),
            "--cache-ram", str(HOST_MIB), "--cache-disk", str(DISK_MIB), "--resident-cells", "512",
            "--cache-min-tokens", "16", "--cache-session-idle", "300"]


HOST_MIB, DISK_MIB = 16, 32


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def metrics(base_url: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(base_url + "/metrics", timeout=30).text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def kv_at_rest(base_url: str, timeout_s: float = 120) -> dict:
    """Wait until no slot is busy; then the KV cells held, as llama.cpp reports them per slot."""
    deadline = time.monotonic() + timeout_s
    while True:
        slots = httpx.get(base_url + "/slots", timeout=30).json()
        if not any(s["is_processing"] for s in slots) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    m = metrics(base_url)
    kv = httpx.get(base_url + "/cache/stats", params={"measure": "true"}, timeout=120).json()["kv"]
    return {"slot_cells": sum(s["kv_pos_max"] + 1 for s in slots),
            "slots_consistent": all(s["kv_pos_max"] == s["n_past"] - 1 for s in slots),
            "resident_cells": m.get("arbor:cache_resident_cells", 0.0),
            # what --resident-cells charges: the owners' cells no slot or parked copy also holds
            "resident_charged_cells": m.get("arbor:cache_resident_charged_cells", 0.0),
            "idle": not any(s["is_processing"] for s in slots),
            "parked_cells": kv.get("parked_cells", 0),  # slots' copies still being written back
            "used_cells": kv["used_cells"]}  # llama.cpp's own count of cells some sequence owns


def kv_after_flush(base_url: str) -> dict:
    """Empty the cache tiers (POST /cache/flush), then the KV at rest: only the slots' kept
    prefixes may still hold cells."""
    httpx.post(base_url + "/cache/flush", timeout=120).raise_for_status()
    return kv_at_rest(base_url)


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


class Traffic:
    """Request bodies (and headers) of the three kinds; agent sessions keep their history."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.sessions: list[tuple[str, list[dict]]] = []

    def next(self) -> tuple[str, dict, dict]:
        kind = self.rng.choices(("agent", "shared", "unique"), weights=(5, 3, 2))[0]
        if kind == "shared":
            return kind, {"messages": [{"role": "system", "content": PREAMBLE},
                                       {"role": "user", "content": f"Question: {_words(self.rng, 6)}?"}]}, {}
        if kind == "unique":
            content = f"{self.rng.random():.6f} {_words(self.rng, 30)}"
            return kind, {"messages": [{"role": "user", "content": content}]}, {}
        return (kind, *self._agent_step())

    def _agent_step(self) -> tuple[dict, dict]:
        rng = self.rng
        if not self.sessions or rng.random() < 0.2:
            self.sessions.append((f"s{len(self.sessions)}", [{"role": "system", "content": SYSTEM}]))
            self.sessions = self.sessions[-16:]
        name, history = rng.choice(self.sessions)
        if len(history) > 3 and rng.random() < 0.2:  # a branch: continue from an earlier point
            history = history[:rng.randrange(2, len(history))]
            name = f"{name}b{rng.randrange(1000)}"
            self.sessions.append((name, history))
        history.append({"role": "user", "content": f"Check {rng.choice(WORDS)}-{rng.randrange(9)}: {_words(rng, 8)}"})
        if len(history) > 12:  # keep sessions inside a slot's context
            del history[1:3]
        state = rng.choice(("active", "tool_wait", "done"))
        body = {"messages": list(history)}
        history.append({"role": "assistant", "content": _words(rng, 5)})
        return body, {"X-Arbor-Session": name, "X-Arbor-Cache-State": state}


async def abandon(client: httpx.AsyncClient, url: str, body: dict, headers: dict, after_s: float,
                  res: SoakResult) -> None:
    """A non-streamed request whose client closes the connection after `after_s`."""
    body = {**body, "max_tokens": 64, "temperature": 0.7, "ignore_eos": True}
    try:
        r = await asyncio.wait_for(client.post(url, json=body, headers=headers), timeout=after_s)
        res.by_status[str(r.status_code)] = res.by_status.get(str(r.status_code), 0) + 1
        res.server_errors += r.status_code >= 500
    except TimeoutError:
        res.answers_abandoned += 1
    except httpx.HTTPError:
        res.client_errors += 1
    finally:
        res.requests += 1


async def one(client: httpx.AsyncClient, url: str, body: dict, headers: dict, cut: bool, res: SoakResult,
              ttfts: list[float]) -> None:
    body = {**body, "max_tokens": 12, "temperature": 0.7, "stream": True}
    t0 = time.perf_counter()
    try:
        async with client.stream("POST", url, json=body, headers=headers) as r:
            res.by_status[str(r.status_code)] = res.by_status.get(str(r.status_code), 0) + 1
            if r.status_code >= 500:
                res.server_errors += 1
            if r.status_code != 200:
                await r.aread()
                return
            first = True
            async for line in r.aiter_lines():
                data = sse.data_of(line)
                if first and data is not None and data.startswith("{") and _has_text(data):
                    first = False
                    ttfts.append(time.perf_counter() - t0)
                    if cut:
                        res.streams_cut += 1
                        return  # leaving the block closes the connection mid-answer
    except httpx.HTTPError:
        res.client_errors += 1
    finally:
        res.requests += 1


def _has_text(chunk: str) -> bool:
    """A chunk with generated text (the first chunk only announces the role, with empty content)."""
    choices = json.loads(chunk).get("choices") or [{}]
    delta = choices[0].get("delta", {})
    return bool(delta.get("content") or delta.get("tool_calls"))


async def drive(base_url: str, workers: int, deadline: float, max_requests: int, seed: int, cut_fraction: float,
                res: SoakResult) -> None:
    traffic, ttfts = Traffic(seed), list[float]()
    rng = random.Random(seed + 1)
    url = base_url + "/v1/chat/completions"
    async with httpx.AsyncClient(timeout=300) as client:
        async def worker():
            while time.monotonic() < deadline and res.requests < max_requests:
                kind, body, headers = traffic.next()
                res.by_kind[kind] = res.by_kind.get(kind, 0) + 1
                cut = rng.random() < cut_fraction
                if cut and rng.random() < 0.5:
                    await abandon(client, url, body, headers, rng.uniform(0.2, 2.0), res)
                else:
                    await one(client, url, body, headers, cut, res, ttfts)

        await asyncio.gather(*(worker() for _ in range(workers)))
    if ttfts:
        ttfts.sort()
        res.ttft_p50_s = statistics.median(ttfts)
        res.ttft_p99_s = ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))]


def held(base_url: str, cache_dir: Path) -> dict:
    """One sample: RSS is added by the caller; the rest from /metrics and the disk itself."""
    m = metrics(base_url)
    return {"sessions": m.get("arbor:cache_sessions", 0.0),
            "host_held_bytes": m.get("arbor:cache_host_held_bytes", 0.0),
            "disk_files_bytes": sum(p.stat().st_size for p in cache_dir.glob("*.kvseg") if p.exists()),
            "disk_queue_bytes": m.get("arbor:cache_disk_pending_bytes", 0.0),
            "abandoned": m.get("arbor:requests_abandoned_total", 0.0)}


def over_budget(sample: dict) -> bool:
    return sample["host_held_bytes"] > HOST_MIB << 20 or sample["disk_files_bytes"] > DISK_MIB << 20


def _sample(pid: int, base_url: str, cache_dir: Path, every_s: float, stop: threading.Event, res: SoakResult) -> None:
    t0 = time.monotonic()
    while True:
        try:
            sample = {"t": round(time.monotonic() - t0, 1), "rss_mib": round(rss_mib(pid), 1),
                      **held(base_url, cache_dir)}
            res.samples.append(sample)
            res.budget_violations += over_budget(sample)
        except (httpx.HTTPError, OSError):
            pass  # a sample missed under load; the next one counts
        if stop.wait(max(every_s, 0.5)):
            return


def _second_half_growth(res: SoakResult, key: str, end: float) -> tuple[float, float]:
    half = [s[key] for s in res.samples if s["t"] >= res.duration_s / 2]
    mid = half[0] if half else end
    return mid, round(100.0 * (end / mid - 1.0), 2) if mid else 0.0


def soak(duration_s: float, max_requests: int, parallel: int, log_dir: Path, seed: int = 0,
         cut_fraction: float = 0.1) -> SoakResult:
    cache_dir = Path(tempfile.mkdtemp(prefix="arbor-soak-kv-"))
    port = free_port()
    res = SoakResult(duration_s=duration_s)
    with running("arbor-soak", arbor_command(port, None, server_args(parallel, cache_dir)), port, log_dir) as server:
        warm = {"messages": [{"role": "user", "content": "warm up"}], "max_tokens": 2}
        httpx.post(server.v1 + "/chat/completions", json=warm, timeout=300).raise_for_status()
        res.rss_start_mib, res.kv_start = rss_mib(server.proc.pid), kv_at_rest(server.base_url)
        stop_sampling = threading.Event()
        sampler = threading.Thread(target=_sample, args=(server.proc.pid, server.base_url, cache_dir, duration_s / 60,
                                                         stop_sampling, res), daemon=True)
        sampler.start()
        asyncio.run(drive(server.base_url, 2 * parallel, time.monotonic() + duration_s, max_requests, seed,
                          cut_fraction, res))
        stop_sampling.set()
        sampler.join()
        res.server_alive = server.proc.poll() is None
        time.sleep(1.0)  # every client has gone: no slot may still work for one
        slots = httpx.get(server.base_url + "/slots", timeout=30).json()
        res.busy_slots_after_clients_left = sum(s["is_processing"] for s in slots)
        res.kv_end = kv_at_rest(server.base_url)
        time.sleep(1.0)  # the disk writer finishes what the last requests queued
        m = metrics(server.base_url)
        res.rss_end_mib = rss_mib(server.proc.pid)
        res.rss_mid_mib, res.rss_growth_second_half_pct = _second_half_growth(res, "rss_mib", res.rss_end_mib)
        res.registry_end = m.get("arbor:cache_sessions", 0.0)
        res.registry_mid, res.registry_growth_second_half_pct = _second_half_growth(res, "sessions", res.registry_end)
        res.requests_abandoned = m.get("arbor:requests_abandoned_total", 0.0)
        final = {"t": round(duration_s, 1), "rss_mib": round(res.rss_end_mib, 1), **held(server.base_url, cache_dir)}
        res.samples.append(final)
        res.budget_violations += over_budget(final)
        res.disk_files = len(list(cache_dir.glob("*.kvseg")))
        res.disk_index_entries = int(m.get("arbor:cache_disk_entries", -1))
        res.disk_index_files = int(m.get("arbor:cache_disk_files", -1))
        res.fallbacks = m.get("arbor:cache_fallbacks", 0.0)
        res.kv_flushed = kv_after_flush(server.base_url)
    shutil.rmtree(cache_dir, ignore_errors=True)
    return res


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration-s", type=float, default=1800)
    p.add_argument("--max-requests", type=int, default=100_000)
    p.add_argument("--parallel", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("bench/results/soak.json"))
    args = p.parse_args(argv)
    res = soak(args.duration_s, args.max_requests, args.parallel, args.out.parent / "soak-logs", args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(asdict(res), indent=2) + "\n")
    for key, value in asdict(res).items():
        if key != "samples":
            print(f"{key}: {value}")
    print("t_s rss_mib sessions host_held_mib disk_files_mib disk_queue_mib abandoned")
    for s in res.samples:
        print(f"{s['t']} {s['rss_mib']} {s['sessions']:.0f} {s['host_held_bytes'] / 2**20:.1f} "
              f"{s['disk_files_bytes'] / 2**20:.1f} {s['disk_queue_bytes'] / 2**20:.1f} {s['abandoned']:.0f}")


if __name__ == "__main__":
    main()
