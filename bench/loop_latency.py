"""How long /metrics and /health take to answer while the cache stores and restores large KV.

    python -m bench.loop_latency [--rounds 6] [--prompt-words 900] [--ref-tree DIR]
                                 [--out bench/results/loop_latency.json]

The server (2 slots, tiers A,S,H,D, write-back at once: `--cache-write-back-step 0`, so a
slot's whole KV is extracted and stored in one go) serves long prompts in turn, each of which
takes a slot that holds another long prefix, while a poller asks GET /metrics and GET /health
every 20 ms. The figures are the answer times (p50, p99, max, answers over 50 ms) of each
endpoint. An HTTP handler that waits for the engine thread (a lock it holds across a KV
extract, or a Python prompt comparison under the engine lock) shows as answers as long as
the extract. `--ref-tree` runs the same load against the arbor-server of another checkout
(e.g. a worktree of an older commit), side by side in one run.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx

from harness.serving.servers import arbor_command, free_port, running

WORDS = "pump valve sensor alarm shift report pressure flow tank motor fan belt filter relay switch".split()


def server_args(cache_dir: Path) -> list[str]:
    return ["--parallel", "2", "--ctx-size", "8192", "--batch-size", "256", "--threads", "2",
            "--cache-tiers", "A,S,H,D", "--cache-dir", str(cache_dir), "--cache-ram", "512",
            "--cache-disk", "1024", "--cache-write-back-step", "0"]


def poll(base_url: str, stop: threading.Event, times: dict[str, list[float]]) -> None:
    with httpx.Client(timeout=30) as client:
        while not stop.is_set():
            for path in ("/metrics", "/health"):
                t0 = time.perf_counter()
                client.get(base_url + path).raise_for_status()
                times[path].append((time.perf_counter() - t0) * 1000.0)
            stop.wait(0.02)


def summary(ms: list[float]) -> dict:
    ms = sorted(ms)
    return {"n": len(ms), "p50_ms": round(statistics.median(ms), 2),
            "p99_ms": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 2), "max_ms": round(ms[-1], 2),
            "over_50ms": sum(m > 50 for m in ms)}


def load(base_url: str, rounds: int, prompt_words: int, seed: int) -> None:
    """Long prompts on 2 slots, each a new prefix: every admission parks or stores the slot's KV."""
    rng = random.Random(seed)
    prompts = [" ".join(rng.choice(WORDS) for _ in range(prompt_words)) for _ in range(4)]
    with httpx.Client(timeout=600) as client:
        for r in range(rounds):
            body = {"messages": [{"role": "user", "content": prompts[r % len(prompts)]}], "max_tokens": 4}
            client.post(base_url + "/v1/chat/completions", json=body).raise_for_status()


def measure(name: str, cwd: Path | None, rounds: int, prompt_words: int, log_dir: Path) -> dict:
    with tempfile.TemporaryDirectory(prefix="arbor-loop-kv-") as kv:
        port = free_port()
        with running(name, arbor_command(port, None, server_args(Path(kv))), port, log_dir, cwd=cwd) as server:
            times: dict[str, list[float]] = {"/metrics": [], "/health": []}
            stop = threading.Event()
            poller = threading.Thread(target=poll, args=(server.base_url, stop, times), daemon=True)
            poller.start()
            t0 = time.perf_counter()
            load(server.base_url, rounds, prompt_words, seed=0)
            wall = time.perf_counter() - t0
            stop.set()
            poller.join()
            stats = httpx.get(server.base_url + "/cache/stats", timeout=60).json()
    return {"server": name, "wall_s": round(wall, 2), "write_backs": stats["engine_thread"]["write_backs"],
            "host_tokens": stats["tiers"]["H"]["tokens"],
            **{path.strip("/"): summary(ms) for path, ms in times.items()}}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--prompt-words", type=int, default=900)
    p.add_argument("--ref-tree", type=Path, help="another checkout whose arbor-server runs the same load")
    p.add_argument("--out", type=Path, default=Path("bench/results/loop_latency.json"))
    args = p.parse_args(argv)
    log_dir = args.out.parent / "logs"
    rows = [measure("arbor", None, args.rounds, args.prompt_words, log_dir)]
    if args.ref_tree is not None:
        rows.append(measure(f"arbor@{args.ref_tree.name}", args.ref_tree, args.rounds, args.prompt_words, log_dir))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rounds": args.rounds, "prompt_words": args.prompt_words, "rows": rows},
                                   indent=2) + "\n")
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
