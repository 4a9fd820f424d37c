"""What a sliding-window model's KV costs, side by side in one run (issue 32): bytes per cached
prefix token in tiers H and D, the state checkpoints kept beside them, and the context's KV
memory, for a Gemma 3 model with its window caches (the default), the same model with
`--swa-full`, and the same model without sliding window (full attention on every layer).

    python -m bench.swa_memory [--model var/models/gemma3-swa-bench6.gguf] [--prefix 1500]
        [--branches 3] [--out bench/results/swa_memory.json]

The full-attention model is the window model's file with its sliding-window keys removed
(`<arch>.attention.sliding_window`, `..._pattern`, `<arch>.rope.freq_base_swa`), written beside it
(`--full-model`, made once): same tensors, layers, widths and vocabulary; llama.cpp's gemma3 loader
then makes every layer global (`LLAMA_SWA_TYPE_NONE`).

For each configuration a fresh arbor-server (`python -m server` of `--arbor-dir`, default this
checkout) with tiers A,S,H,D and `--cache-idle-cells 0` (an idle slot is written back to H and D
while another request runs) serves, one after the other: a shared prefix of `--prefix` tokens
plus a branch of `--branch-tokens`, `--branches` times, then `--parallel` unrelated prompts that
take the slots (so the branches are written back). Token ids are drawn at random (seeded), sent to
/completion. Then, from the server itself: /cache/stats (H and D bytes and tokens, the host
checkpoints and their files, the slots' checkpoints), /props (n_ctx), and llama.cpp's own lines
in the server log (`--log-level debug`): `llama_kv_cache: size = ... MiB (cells, layers, seqs)`,
one per KV cache (the window model has two: its global and its window layers), and the compute
buffers. Results go to --out; bench/report.py makes the docs/benchmarks.md table.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from harness.serving.servers import ROOT, arbor_command, free_port, running

DEFAULT_MODEL = Path("var/models/gemma3-swa-bench6.gguf")
HEADING = "## Sliding-window KV memory: window caches, --swa-full, full attention"
SWA_KEYS = ("attention.sliding_window", "attention.sliding_window_pattern", "rope.freq_base_swa")

KV_LINE = re.compile(r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers, +(\d+)/(\d+) seqs\), "
                     r"K \((\w+)\): +([\d.]+) MiB, V \((\w+)\): +([\d.]+) MiB")
COMPUTE_LINE = re.compile(r"sched_reserve: +(\S+) compute buffer size = +([\d.]+) MiB")


def derive_full_attention(src: Path, dst: Path) -> Path:
    """`src` without its sliding-window keys, at `dst` (same tensors and every other key)."""
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    reader = gguf.GGUFReader(src, "r")
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()  # type: ignore[union-attr]
    name = reader.get_field(gguf.Keys.General.NAME)
    tmp = dst.with_suffix(".tmp")
    writer = gguf.GGUFWriter(tmp, arch=arch, endianess=reader.endianess)
    alignment = reader.get_field(gguf.Keys.General.ALIGNMENT)
    if alignment is not None:
        writer.data_alignment = alignment.contents()
    new = {gguf.Keys.General.NAME: MetadataDetails(gguf.GGUFValueType.STRING,
                                                   f"{name.contents() if name else arch}-full-attention")}
    copy_with_new_metadata(reader, writer, new, [f"{arch}.{k}" for k in SWA_KEYS])
    tmp.replace(dst)
    return dst


def kv_report(log_text: str) -> dict:
    """llama.cpp's KV caches and compute buffers as the server's log states them."""
    caches = [{"mib": float(m[1]), "cells": int(m[2]), "layers": int(m[3]), "seqs": int(m[4]), "streams": int(m[5]),
               "k_type": m[6], "k_mib": float(m[7]), "v_type": m[8], "v_mib": float(m[9])}
              for m in KV_LINE.finditer(log_text)]
    compute = {m[1]: float(m[2]) for m in COMPUTE_LINE.finditer(log_text)}  # the last reservation per device
    return {"caches": caches, "kv_mib": round(sum(float(m[1]) for m in KV_LINE.finditer(log_text)), 2),
            "compute_mib": round(sum(compute.values()), 2), "compute": compute}


def prompts(a: argparse.Namespace) -> list[tuple[str, list[int]]]:
    """(label, token ids): the branches over the shared prefix, then the prompts that take the slots."""
    rng = np.random.default_rng(a.seed)

    def draw(n: int) -> list[int]:  # ordinary tokens of the vocabulary
        return [int(t) for t in rng.integers(1000, 40000, size=n)]

    prefix = draw(a.prefix)
    out = [(f"branch {i + 1}", prefix + draw(a.branch_tokens)) for i in range(a.branches)]
    return out + [(f"other {i + 1}", draw(a.other_tokens)) for i in range(a.parallel)]


def wait_written(base: str, timeout: float = 120) -> dict:
    """/cache/stats once D's writer and the checkpoint files' writer have nothing pending."""
    deadline = time.monotonic() + timeout
    while True:
        stats = httpx.get(base + "/cache/stats", timeout=60).json()
        ckpt_disk = stats["tiers"]["A"].get("state", {}).get("host_checkpoints", {}).get("disk", {})
        pending = stats["tiers"]["D"].get("pending_bytes", 0) + ckpt_disk.get("pending_bytes", 0)
        if not pending or time.monotonic() > deadline:
            return stats
        time.sleep(0.5)


def per_token(tier: dict) -> float | None:
    return tier["bytes"] / tier["tokens"] if tier.get("tokens") else None


def run_config(a: argparse.Namespace, name: str, model: Path, flags: list[str], work: list[tuple[str, list[int]]],
               tmp: Path) -> dict:
    args = ["--parallel", str(a.parallel), "--ctx-size", str(a.ctx_size), "--threads", str(a.threads),
            "--cache-tiers", "A,S,H,D", "--cache-dir", str(tmp / f"kv-{name}"), "--cache-min-tokens", "16",
            "--cache-idle-cells", "0", "--log-level", "debug", *flags]
    port = free_port()
    cmd = arbor_command(port, model.resolve(), args)
    log_dir = a.out.parent / "swa_memory_logs"
    requests = []
    with running(f"swa_memory_{name}", cmd, port, log_dir, cwd=a.arbor_dir) as srv:
        props = httpx.get(srv.base_url + "/props", timeout=60).json()
        for label, ids in work:
            t0 = time.perf_counter()
            r = httpx.post(srv.base_url + "/completion", json={"prompt": ids, "n_predict": 4, "temperature": 0},
                           timeout=900)
            r.raise_for_status()
            body = r.json()
            cache = body.get("arbor", {}).get("cache", {})
            requests.append({"label": label, "prompt_tokens": len(ids), "cached": body["timings"]["cache_n"],
                             "source": cache.get("source"), "wall_s": round(time.perf_counter() - t0, 3)})
            print(f"  {name}: {label} {len(ids)} tokens, {requests[-1]['cached']} cached ({cache.get('source')})",
                  flush=True)
        stats = wait_written(srv.base_url)
    log_text = (log_dir / f"swa_memory_{name}.log").read_text(errors="replace")
    tiers = stats["tiers"]
    state = tiers["A"].get("state", {})
    host_ckpt = state.get("host_checkpoints", {})
    h, d = tiers["H"], tiers["D"]
    ckpt_bytes = host_ckpt.get("bytes", 0)
    return {
        "name": name, "model": str(model), "flags": flags, "command": shlex.join(cmd),
        "n_ctx": props.get("n_ctx"), "kv_cells": props.get("arbor", {}).get("kv_cells"),
        "memory": state.get("memory"), "cache_note": stats.get("note"),
        "requests": requests,
        "H": {"tokens": h.get("tokens"), "bytes": h.get("bytes"), "bytes_per_token": per_token(h)},
        "D": {"tokens": d.get("tokens"), "bytes": d.get("bytes"), "bytes_per_token": per_token(d),
              "pending_bytes": d.get("pending_bytes"), "dropped_writes": d.get("dropped_writes")},
        "host_checkpoints": {k: host_ckpt.get(k) for k in ("entries", "bytes", "stored", "hits", "evictions")}
        if host_ckpt else None,
        "checkpoint_files": {k: host_ckpt["disk"].get(k) for k in ("files", "bytes", "pending_writes",
                                                                    "dropped_writes", "hits")}
        if host_ckpt.get("disk") else None,
        "slot_checkpoints": state.get("checkpoints"),
        # what H holds for the prefixes it keeps, with the checkpoints a restore from it needs
        "H_with_checkpoints_bytes_per_token": ((h["bytes"] + ckpt_bytes) / h["tokens"]) if h.get("tokens") else None,
        "context": kv_report(log_text),
    }


def report_section(res: Path) -> list[str]:
    """The docs/benchmarks.md section (bench/report.py) from bench/results/swa_memory.json."""
    out = [HEADING, ""]
    path = res / "swa_memory.json"
    if not path.exists():
        return out + ["Not measured in this revision.", ""]
    data = json.loads(path.read_text())
    p = data["params"]
    out += [f"Command: `{data['command']}` (started {data['started']}, arbor {data.get('arbor_commit', '?')}): "
            f"one fresh arbor-server per row, `--cache-tiers A,S,H,D --cache-idle-cells 0 --parallel "
            f"{p['parallel']} --ctx-size {p['ctx_size']}`; {p['branches']} requests of a {p['prefix']}-token shared "
            f"prefix + {p['branch_tokens']} tokens of their own, then {p['parallel']} unrelated "
            f"{p['other_tokens']}-token prompts that take the slots (random token ids, 4 tokens generated each). "
            "Bytes per token: /cache/stats' bytes over tokens of tiers H and D; checkpoints: the host store's "
            "(`tiers.A.state.host_checkpoints`) and their files; context KV: llama.cpp's `llama_kv_cache: size` "
            "lines in the server's log (one per KV cache).", "",
            "| configuration | model | n_ctx | KV caches: cells x layers = MiB (sequences) | context KV MiB "
            "| compute buffer MiB | H bytes/token | D bytes/token | checkpoints in RAM: n (bytes) "
            "| checkpoint files: n (bytes) | (H + checkpoints) / H tokens | branches: cached tokens (source) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["runs"]:
        ctx = r["context"]
        caches = "; ".join(f"{c['cells']} x {c['layers']} = {c['mib']:.2f} ({c['seqs']})" for c in ctx["caches"])
        hc, cf = r.get("host_checkpoints"), r.get("checkpoint_files")
        hc_cell = f"{hc['entries']} ({hc['bytes']:,})" if hc else "–"
        cf_cell = f"{cf['files']} ({cf['bytes']:,})" if cf else "–"
        cached = ", ".join(f"{q['cached']} ({q['source']})" for q in r["requests"] if q["label"].startswith("branch"))
        bpt = lambda x: "–" if x is None else f"{x:,.0f}"  # noqa: E731
        out.append(f"| {r['name']} | `{Path(r['model']).name}` | {r['n_ctx']} | {caches} | {ctx['kv_mib']:.2f} "
                   f"| {ctx['compute_mib']:.2f} | {bpt(r['H']['bytes_per_token'])} | {bpt(r['D']['bytes_per_token'])} "
                   f"| {hc_cell} | {cf_cell} | {bpt(r['H_with_checkpoints_bytes_per_token'])} | {cached} |")
    return out + [""]


def git_commit(directory: Path) -> str:
    try:
        return subprocess.run(["git", "-C", str(directory), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="a sliding-window model (Gemma 3)")
    p.add_argument("--full-model", type=Path, default=None,
                   help="the same model without sliding window (default: <model>-full-attention.gguf, made once)")
    p.add_argument("--prefix", type=int, default=1500)
    p.add_argument("--branches", type=int, default=3)
    p.add_argument("--branch-tokens", type=int, default=200)
    p.add_argument("--other-tokens", type=int, default=300)
    p.add_argument("--parallel", type=int, default=2)
    p.add_argument("--ctx-size", type=int, default=8192)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arbor-dir", type=Path, default=ROOT, help="the checkout whose server runs")
    p.add_argument("--arbor-commit", default=None, help="what --arbor-dir holds, for the record (default: its HEAD)")
    p.add_argument("--out", type=Path, default=Path("bench/results/swa_memory.json"))
    a = p.parse_args(argv)
    full = a.full_model or a.model.with_name(a.model.stem + "-full-attention.gguf")
    if not full.exists():
        print(f"writing {full} (the window model without sliding window)", flush=True)
        derive_full_attention(a.model, full)
    work = prompts(a)
    command = ("python -m bench.swa_memory " + shlex.join(sys.argv[1:] if argv is None else argv)).strip()
    data: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "command": command,
                  "arbor_commit": a.arbor_commit or git_commit(a.arbor_dir),
                  "params": {k: getattr(a, k) for k in ("prefix", "branches", "branch_tokens", "other_tokens",
                                                        "parallel", "ctx_size", "threads", "seed")},
                  "runs": []}
    configs = [("window caches (default)", a.model, []), ("--swa-full", a.model, ["--swa-full"]),
               ("full attention (no sliding window)", full, [])]
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, model, flags) in enumerate(configs):
            print(name, flush=True)
            run = run_config(a, f"{i}", model, flags, work, Path(tmp))
            run["name"] = name
            data["runs"].append(run)
            print(f"  context KV {run['context']['kv_mib']} MiB, H {run['H']['bytes_per_token']} B/token, "
                  f"checkpoints {run['host_checkpoints']}", flush=True)
    a.out.write_text(json.dumps(data, indent=2))
    print("wrote", a.out)


if __name__ == "__main__":
    main()
