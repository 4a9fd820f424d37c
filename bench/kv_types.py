"""The KV cache's element types side by side (`--cache-type-k/-v`, issue 32 item 5): bytes per
cached token in H and D, the agent workload's computed tokens and wall, and agreement with f16.

    python -m bench.kv_types [--types f16,q8_0] [--quick] [--threads 2] [--out bench/results/kv_types]

For each type T (K and V both T, flash attention on for every type, so only the type differs):
1. the agent workload (bench.run_all's `agent_sessions`) on a fresh arbor-server with the
   default tiers plus the disk (A,S,H,D) and `--cache-type-k T --cache-type-v T`: computed
   prompt tokens against the ideal, wall, TTFT, where the prefixes came from;
2. bytes per cached token, in process: the workload's longest prompt is run, every device
   copy is dropped (so it is written back to H and D), and the tiers' /cache/stats bytes over
   tokens are read;
3. agreement with f16: the workload's last prompt of every session (rendered by the f16
   server's template) is computed by an f16 and a T context, and every position's top-1
   prediction compared (teacher-forced), and so is the greedy reply of each (first 16 tokens).
Results go to --out/index.json; bench/report.py makes the docs/benchmarks.md table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from bench.run_all import workloads
from harness.serving.runner import ReplaySettings, replay
from harness.serving.servers import arbor_command, free_port, running
from server.model_file import embedded_model_path

WORKLOAD = "agent_sessions"
REPLY_TOKENS = 16


def _flags(t: str) -> list[str]:
    return ["--cache-type-k", t, "--cache-type-v", t, "--flash-attn", "on"]


def run_workload(a: argparse.Namespace, t: str, work, lines, tmp: Path) -> tuple[dict, list[str]]:
    """The agent workload on a fresh server of KV type t; with render, also the prompts' texts."""
    args = ["--parallel", str(a.parallel), "--ctx-size", str(a.ctx_size), "--threads", str(a.threads),
            "--cache-min-tokens", "16", "--cache-tiers", "A,S,H,D", "--cache-dir", str(tmp / f"kv-{t}"), *_flags(t)]
    port = free_port()
    cmd = arbor_command(port, a.model, args)
    with running(f"kv_types_{t}", cmd, port, a.out / "logs") as srv:
        settings = ReplaySettings(base_url=srv.v1, concurrency=a.concurrency, force_output_length=True,
                                  progress=False, label=f"arbor A,S,H,D {t}")
        result = asyncio.run(replay(lines, settings))
        stats = httpx.get(srv.base_url + "/cache/stats", timeout=60).json()
        prompts = []
        if t == "f16":  # the last request of each session: the longest prompt of its history
            last = {line.session_id: line for line in lines}
            for line in last.values():
                answer = httpx.post(srv.base_url + "/apply-template", json=line.body, timeout=120)
                answer.raise_for_status()
                prompts.append(answer.json()["prompt"])
    path = result.save(a.out / WORKLOAD / f"{t}.json")
    summ = result.summary
    run = {"type": t, "command": shlex.join(cmd), "result": str(path), "computed": summ["tokens"]["computed"],
           "ideal": summ.get("ideal", {}).get("ideal_computed_tokens"),
           "computed_over_ideal": summ.get("ideal", {}).get("computed_over_ideal"), "wall_s": summ["wall_s"],
           "ttft_p50_s": summ["ttft_s"].get("p50"), "ttft_mean_s": summ["ttft_s"].get("mean"),
           "sources": summ.get("cache_sources"), "tiers_after_run": {k: stats.get(k) for k in ("host", "disk")}}
    return run, prompts


def bytes_per_token(a: argparse.Namespace, t: str, prompt: str, tmp: Path) -> dict:
    """Run `prompt`, drop every device copy (written back to H and D), read the tiers' bytes per token."""
    from server import bootstrap
    from server.engine.sampling_params import SamplingParams
    from server.engine.sequence import Finished, GenerationRequest
    from server.settings import ServerSettings

    model = bootstrap.load(ServerSettings(model=a.model, parallel=2, ctx_size=a.ctx_size, threads=a.threads,
                                          cache_min_tokens=16, cache_tiers=("A", "H", "D"),
                                          cache_dir=tmp / f"bpt-{t}", cache_type_k=t, cache_type_v=t,
                                          flash_attn="on"))
    try:
        import threading

        done = threading.Event()
        tokens = model.runtime.tokenize(prompt, add_special=False, parse_special=True)
        model.engine.submit(GenerationRequest(prompt_tokens=tokens, sampling=SamplingParams(temperature=0),
                                              max_tokens=2),
                            lambda ev: done.set() if isinstance(ev, Finished) else None)
        if not done.wait(600):
            raise RuntimeError("the request did not finish")
        assert model.router is not None and model.router.host is not None and model.router.disk is not None
        model.engine.run_exclusive(model.router.drop_device_copies)
        model.router.disk.wait_idle()
        host, disk = model.router.host.stats(), model.router.disk.stats()
        return {"type": t, "prompt_tokens": len(tokens),
                "host": {"tokens": host["tokens"], "bytes": host["bytes"],
                         "bytes_per_token": host["bytes"] / max(1, host["tokens"])},
                "disk": {"tokens": disk["tokens"], "bytes": disk["bytes"],
                         "bytes_per_token": disk["bytes"] / max(1, disk["tokens"])}}
    finally:
        model.close()


def predictions(a: argparse.Namespace, t: str, prompts: list[str]) -> list[dict]:
    """Per prompt: the top-1 prediction at every position, then a greedy reply of REPLY_TOKENS."""
    from server.engine.llama_runtime import BatchEntry, LlamaRuntime, RuntimeConfig

    rt = LlamaRuntime(RuntimeConfig(a.model or embedded_model_path(), n_ctx=4096, n_batch=256, n_seq_max=1,
                                    n_threads=a.threads, n_threads_batch=a.threads, flash_attn=True,
                                    cache_type_k=t, cache_type_v=t))
    out = []
    try:
        for text in prompts:
            t0 = time.perf_counter()
            rt.seq_rm(0, -1, -1)
            toks = rt.tokenize(text, add_special=False, parse_special=True)
            top1: list[int] = []
            for i in range(0, len(toks), 256):
                rows = rt.decode([BatchEntry(tok, i + j, 0, True) for j, tok in enumerate(toks[i:i + 256])])
                top1 += [int(np.argmax(np.ctypeslib.as_array(rt.logits_row(r)))) for r in rows]
            prefill_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            reply = [top1[-1]]
            while len(reply) < REPLY_TOKENS and not rt.is_eog(reply[-1]):
                (row,) = rt.decode([BatchEntry(reply[-1], len(toks) + len(reply) - 1, 0, True)])
                reply.append(int(np.argmax(np.ctypeslib.as_array(rt.logits_row(row)))))
            out.append({"top1": top1[:-1], "reply": reply, "prefill_s": prefill_s,
                        "decode_s": time.perf_counter() - t0, "decoded": len(reply) - 1})
    finally:
        rt.close()
    return out


def agreement(ref: list[dict], got: list[dict]) -> dict:
    same = total = 0
    for r, g in zip(ref, got, strict=True):
        same += sum(x == y for x, y in zip(r["top1"], g["top1"], strict=True))
        total += len(r["top1"])
    replies = sum(r["reply"] == g["reply"] for r, g in zip(ref, got, strict=True))
    return {"teacher_forced_top1": same / total, "positions": total, "same_greedy_replies": replies,
            "replies": len(ref), "reply_tokens": REPLY_TOKENS}


def speed(preds: list[dict]) -> dict:
    """Prompt and decode tokens per second of one context over the prompts (in process, one sequence)."""
    positions = sum(len(p["top1"]) + 1 for p in preds)
    decoded = sum(p["decoded"] for p in preds)
    return {"prefill_tok_s": positions / sum(p["prefill_s"] for p in preds),
            "decode_tok_s": decoded / max(1e-9, sum(p["decode_s"] for p in preds))}


HEADING = "## KV cache types: q8_0 against f16"


def report_section(res: Path) -> list[str]:
    """The docs/benchmarks.md section (bench/report.py) from --out's index.json."""
    out = [HEADING, ""]
    path = res / "kv_types" / "index.json"
    if not path.exists():
        return out + ["Not measured in this revision.", ""]
    index = json.loads(path.read_text())
    p = index["workload_params"]
    out += [f"Command: `{index['command']}` (started {index['started']}): K and V of one type, flash attention "
            f"on for every type; the `{index['workload']}` workload ({p.get('sessions')} sessions of "
            f"{p.get('turns')} turns) on arbor-server `--cache-tiers A,S,H,D`, a fresh server per type; bytes per "
            "cached token from /cache/stats after the workload's longest prompt was written back to H and D; "
            "agreement: the last prompt of every session computed by an f16 and a T context, every position's "
            "top-1 compared (teacher-forced), and the greedy replies; prefill / decode tok/s: those contexts' own "
            "speed over the same prompts (one sequence, in process).", "",
            "| KV type | H bytes/token | D bytes/token | x f16 (H, D) | computed prompt tokens | computed/ideal "
            "| wall s | TTFT p50 s | sources | prefill / decode tok/s | top-1 agreement with f16 "
            "| same greedy replies |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    bpt = {b["type"]: b for b in index["bytes_per_token"]}
    f16 = bpt.get("f16")
    for run in index["runs"]:
        t = run["type"]
        b = bpt.get(t)
        h, d = (b["host"]["bytes_per_token"], b["disk"]["bytes_per_token"]) if b else (None, None)
        rel = (f"{h / f16['host']['bytes_per_token']:.3f}, {d / f16['disk']['bytes_per_token']:.3f}"
               if b and f16 else "–")
        agree = index["agreement"].get(t)
        tf = f"{agree['teacher_forced_top1']:.3f} ({agree['positions']} positions)" if agree else "–"
        greedy = (f"{agree['same_greedy_replies']}/{agree['replies']} ({agree['reply_tokens']} tokens)"
                  if agree else "–")
        sp = index.get("speed", {}).get(t)
        speed_cell = f"{sp['prefill_tok_s']:.0f} / {sp['decode_tok_s']:.1f}" if sp else "–"
        sources = ", ".join(f"{k}:{v}" for k, v in sorted((run.get("sources") or {}).items()))
        out.append(f"| {t} | {h:.0f} | {d:.0f} | {rel} | {run['computed']} | {run['computed_over_ideal']:.2f} "
                   f"| {run['wall_s']:.1f} | {run['ttft_p50_s']:.2f} | {sources} | {speed_cell} | {tf} | {greedy} |")
    return out + [""]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--types", default="f16,q8_0", help="comma list of KV types (K and V alike); f16 is always run")
    p.add_argument("--quick", action="store_true", help="the quick agent workload")
    p.add_argument("--model", type=Path, default=None)
    p.add_argument("--parallel", type=int, default=4)
    p.add_argument("--ctx-size", type=int, default=8192)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--out", type=Path, default=Path("bench/results/kv_types"))
    a = p.parse_args(argv)
    types = ["f16"] + [t for t in a.types.split(",") if t and t != "f16"]
    work = workloads(a.quick)[WORKLOAD]
    command = ("python -m bench.kv_types " + shlex.join(sys.argv[1:] if argv is None else argv)).strip()
    index: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "model": str(a.model or embedded_model_path()),
                   "command": command,
                   "workload": WORKLOAD, "workload_params": work.describe()["params"], "runs": [],
                   "bytes_per_token": [], "agreement": {}}
    a.out.mkdir(parents=True, exist_ok=True)
    prompts: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for t in types:
            run, rendered = run_workload(a, t, work, work.lines, Path(tmp))
            prompts = prompts or rendered
            index["runs"].append(run)
            print(f"{t:6s} computed={run['computed']} ideal={run['ideal']} ratio={run['computed_over_ideal']} "
                  f"wall={run['wall_s']:.1f}s", flush=True)
        longest = max(prompts, key=len)
        for t in types:
            index["bytes_per_token"].append(bytes_per_token(a, t, longest, Path(tmp)))
            print(t, "bytes/token", index["bytes_per_token"][-1], flush=True)
    preds = {t: predictions(a, t, prompts) for t in types}
    index["speed"] = {t: speed(preds[t]) for t in types}
    print("speed", index["speed"], flush=True)
    for t in types[1:]:
        index["agreement"][t] = agreement(preds["f16"], preds[t])
        print(t, "agreement with f16", index["agreement"][t], flush=True)
    (a.out / "index.json").write_text(json.dumps(index, indent=2))
    print("wrote", a.out / "index.json")


if __name__ == "__main__":
    main()
