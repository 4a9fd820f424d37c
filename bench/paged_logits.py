"""Paged attention against llama.cpp's attention over every cell, logit by logit: the same scripted KV
operations on two contexts of one model, one paged and one not, every output row compared.

    python -m bench.paged_logits [--model M.gguf] [--page-size 7,16] [--threads 1] [--controls threads,layout]

bench/paged_agreement.py counts top-1 agreement, which a wrong cell seldom moves; this reports, per
page size and thread count, the largest |logit difference| and the KL divergence KL(p_unpaged ||
p_paged) of the softmax at every output position (mean and max), per step of the script and over
all of it. The script (`workload`) runs what the cache does to the unified KV: a prompt written once
for three sequences (tokens with several sequence ids), an idle sequence's cells between the
others', a middle range removed and the tail shifted back (llama.cpp's context shift: seq_rm +
seq_add), positions divided (seq_div), one sharer kept alone (seq_keep) and the freed cells reused, a
whole-context state saved, overwritten and restored, and decode steps of three sequences at once,
then of one (the CPU kernel's tiled prefill, per-row and split-KV paths).

`Twin` (two contexts driven in lockstep, a batch with several sequence ids per token) is also what
tests/server/engine/test_paged_attention_logits.py runs its scripts on.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import platform
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import llama_cpp
import numpy as np

from server.engine import paged_attention
from server.engine.llama_runtime import LlamaRuntime, RuntimeConfig

#: (token, position, sequence ids, wants logits): one token of a batch; several sequence ids write one
#: cell that all of them own (llama_batch's n_seq_id > 1), the token attends as its first one
Token = tuple[int, int, Sequence[int], bool]


@dataclass(frozen=True)
class StepDiff:
    """One decode of the script: its output rows compared, unpaged against paged."""

    label: str
    rows: int
    max_abs: float  # max |logit_paged - logit_unpaged| over the rows and the vocabulary (inf: a row not finite)
    kl_mean: float  # mean over the rows of KL(softmax(unpaged) || softmax(paged)), nats
    kl_max: float
    top1_differs: int  # rows whose argmax differs


def kl_rows(ref: np.ndarray, other: np.ndarray) -> np.ndarray:
    """KL(softmax(ref) || softmax(other)) of each row, in float64 (nats)."""
    a = ref.astype(np.float64)
    b = other.astype(np.float64)
    la = a - a.max(axis=1, keepdims=True)
    la -= np.log(np.exp(la).sum(axis=1, keepdims=True))
    lb = b - b.max(axis=1, keepdims=True)
    lb -= np.log(np.exp(lb).sum(axis=1, keepdims=True))
    return np.maximum((np.exp(la) * (la - lb)).sum(axis=1), 0.0)


def compare(label: str, off: np.ndarray, on: np.ndarray) -> StepDiff:
    if not (np.isfinite(off).all() and np.isfinite(on).all()):
        return StepDiff(label, len(off), float("inf"), float("inf"), float("inf"), len(off))
    kl = kl_rows(off, on)
    return StepDiff(label, len(off), float(np.abs(on - off).max()), float(kl.mean()), float(kl.max()),
                    int((off.argmax(axis=1) != on.argmax(axis=1)).sum()))


def _get_paged_attn():
    fn = llama_cpp.llama_cpp._lib.llama_get_paged_attn
    fn.argtypes, fn.restype = [ctypes.c_void_p], ctypes.c_uint32
    return fn


class Twin:
    """Two contexts of one model, `off` unpaged and `on` paged (or, with `paged_later`, unpaged until
    `set_page_size`), to which every operation is applied alike; each decode's logits are compared
    and kept in `steps`, the logits themselves in `rows` when `keep_rows`."""

    def __init__(self, model: Path, *, page_size: int, n_ctx: int = 1024, n_batch: int = 256, n_seq_max: int = 6,
                 threads: int = 1, paged_later: bool = False, keep_rows: bool = False,
                 control_threads: int | None = None, control_pad: int = 0,
                 page_placement: Literal["owned", "shared"] = "owned"):
        def runtime(mode: Literal["on", "off"], n_threads: int) -> LlamaRuntime:
            return LlamaRuntime(RuntimeConfig(model, n_ctx=n_ctx, n_batch=n_batch, n_seq_max=n_seq_max,
                                              n_threads=n_threads, n_threads_batch=n_threads, flash_attn=True,
                                              kv_unified=True, paged_attn=mode, page_size=page_size,
                                              page_placement=page_placement))

        self.off = runtime("off", threads)
        try:
            # control_threads: the second context unpaged too, with another thread count (llama.cpp's own spread)
            # control_pad: the second context unpaged too, its cells laid out `control_pad` cells further on (an
            # unattended sequence, the last id, holds the first ones): llama.cpp's own spread over cell layouts
            self.on = (runtime("off", control_threads or threads) if control_threads or control_pad
                       else runtime("off" if paged_later else "on", threads))
        except Exception:
            self.off.close()
            raise
        self.n_seq_max = n_seq_max
        self.n_vocab = self.off.n_vocab
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, n_seq_max)
        self.steps: list[StepDiff] = []
        self.keep_rows = keep_rows
        self.rows: list[tuple[np.ndarray, np.ndarray]] = []
        self.decode_s = 0.0
        if control_pad:
            self._decode(self.on, [(3 + i, i, (n_seq_max - 1,), False) for i in range(control_pad)])
        # llama.cpp checks every paged mask against its own (native/src/llama-kv-paged-mask.cpp): self_check_failures()
        # counts the misses
        paged_attention.set_self_check(self.on.ctx, True)

    def self_check_failures(self) -> int:
        """Ubatches whose paged mask failed llama.cpp's self-check in the paged context (0 when all passed)."""
        return paged_attention.self_check_failures(self.on.ctx)

    def page_size(self) -> int:
        """The page size in force in the paged context (0: unpaged)."""
        return int(_get_paged_attn()(self.on.ctx))

    def set_page_size(self, page_size: int) -> None:
        """Turn paging on (or change its page size, or with 0 turn it off) in the paged context, whatever
        its cells hold: llama.cpp rebuilds each sequence's page counts from its cells."""
        if page_size == 0:
            code = paged_attention._set_paged_attn()(self.on.ctx, 0)
            if code != 0:
                raise RuntimeError(f"llama_set_paged_attn(0) returned {code}")
        else:
            paged_attention.enable(self.on.ctx, page_size)
        if self.page_size() != page_size:
            raise RuntimeError(f"page size {page_size} asked for, {self.page_size()} in force")

    def _decode(self, rt: LlamaRuntime, tokens: Sequence[Token]) -> np.ndarray:
        b = self._batch
        for i, (tok, pos, seqs, want) in enumerate(tokens):
            b.token[i] = tok
            b.pos[i] = pos
            b.n_seq_id[i] = len(seqs)
            for k, s in enumerate(seqs):
                b.seq_id[i][k] = s
            b.logits[i] = want
        b.n_tokens = len(tokens)
        rc = llama_cpp.llama_decode(rt.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        n_out = sum(1 for t in tokens if t[3])
        return np.array(rt.logits_matrix(n_out)) if n_out else np.zeros((0, self.n_vocab), np.float32)

    def decode(self, label: str, tokens: Sequence[Token]) -> StepDiff:
        """One llama_decode of `tokens` on both contexts; the output rows compared (and recorded)."""
        t0 = time.perf_counter()
        off = self._decode(self.off, tokens)
        on = self._decode(self.on, tokens)
        self.decode_s += time.perf_counter() - t0
        step = compare(label, off, on)
        if step.rows:
            self.steps.append(step)
            if self.keep_rows:
                self.rows.append((off, on))
        return step

    def prefill(self, label: str, tokens: Sequence[int], seqs: Sequence[int], start: int, *, chunk: int = 128,
                logits: bool = True) -> None:
        """`tokens` at positions start.. for the sequences `seqs` (one cell each, owned by all of them)."""
        for i in range(0, len(tokens), chunk):
            part = tokens[i:i + chunk]
            self.decode(f"{label} [{start + i}, {start + i + len(part)})",
                        [(t, start + i + k, seqs, logits) for k, t in enumerate(part)])

    def memory(self, op: str, *args: int) -> object:
        """llama_memory_<op>(memory, *args) on both contexts; both must answer alike."""
        fn = getattr(llama_cpp, f"llama_memory_{op}")
        a, b = fn(self.off.memory, *args), fn(self.on.memory, *args)
        if a != b:
            raise AssertionError(f"llama_memory_{op}{args}: unpaged answered {a}, paged {b}")
        return a

    def pos_range(self, seq: int) -> tuple[int, int]:
        got = {(rt.seq_pos_min(seq), rt.seq_pos_max(seq)) for rt in (self.off, self.on)}
        if len(got) != 1:
            raise AssertionError(f"seq {seq}: positions differ paged and unpaged: {got}")
        return got.pop()

    def state_get(self) -> bytes:
        """The whole context's state (llama_state_get_data: every cell, its sequences, the logits), from
        the unpaged context."""
        ctx = self.off.ctx
        size = llama_cpp.llama_state_get_size(ctx)
        buf = (ctypes.c_uint8 * size)()
        n = llama_cpp.llama_state_get_data(ctx, buf, size)
        return bytes(buf[:n])

    def state_set(self, data: bytes) -> None:
        """Restore a whole-context state into both contexts (llama_state_set_data)."""
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        for rt in (self.off, self.on):
            if llama_cpp.llama_state_set_data(rt.ctx, buf, len(data)) != len(data):
                raise RuntimeError("llama_state_set_data did not read the whole state")

    def worst(self) -> StepDiff:
        return max(self.steps, key=lambda s: (s.max_abs, s.kl_max))

    def summary(self) -> dict:
        rows = sum(s.rows for s in self.steps)
        return {"steps": len(self.steps), "positions": rows,
                "max_abs": max(s.max_abs for s in self.steps),
                "kl_mean": sum(s.kl_mean * s.rows for s in self.steps) / rows,
                "kl_max": max(s.kl_max for s in self.steps),
                "top1_differs": sum(s.top1_differs for s in self.steps),
                "worst_step": self.worst().label}

    def close(self) -> None:
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        self.off.close()
        self.on.close()


TEXT = ("The pump on line 3 reported a pressure drop at 04:10; the valve sensor drifted by two percent "
        "and the operator logged an alarm. Maintenance replaced the seal and the reading recovered. ")


def workload(tw: Twin, toks: Sequence[int], *, scale: int = 1) -> None:
    """The bench's script over a busy unified KV (sequences 0-4; `scale` multiplies the lengths)."""
    def t(i: int) -> int:
        return toks[i % len(toks)]

    def nxt(seq: int) -> int:
        return tw.pos_range(seq)[1] + 1

    n_sys, n_idle, n_user = 160 * scale, 200 * scale, 64 * scale
    # a system prompt written once for sequences 0, 1 and 2 (each of its tokens in three sequences)
    tw.prefill("shared prompt, seqs 0+1+2", [t(i) for i in range(n_sys)], (0, 1, 2), 0)
    tw.prefill("seq 3, idle", [t(500 + i) for i in range(n_idle)], (3,), 0)
    # the three sharers continue in one batch, each with its own turn
    for k0 in range(0, n_user, 32):
        tw.decode(f"three turns [{n_sys + k0}, {n_sys + k0 + 32})",
                  [(t(1000 * s + k0 + k), n_sys + k0 + k, (s,), True) for s in (0, 1, 2) for k in range(32)])
    # seq 3: a middle range removed and the tail moved back over it (llama.cpp's context shift), then its
    # positions halved (self-extend's seq_div)
    cut0, cut1 = n_idle // 4, n_idle // 4 + 48 * scale
    tw.memory("seq_rm", 3, cut0, cut1)
    tw.memory("seq_add", 3, cut1, -1, -(cut1 - cut0))
    tw.memory("seq_div", 3, 0, -1, 2)
    for k in range(16):
        tw.decode(f"four sequences after seq 3's shift and div, step {k}",
                  [(t(3000 + 100 * s + k), nxt(s), (s,), True) for s in (0, 1, 2, 3)])
    state = tw.state_get()
    # seq 2 kept alone: the idle cells and the other sharers' go, and a new sequence reuses them
    tw.memory("seq_keep", 2)
    tw.prefill("seq 4 in freed cells", [t(4000 + i) for i in range(300 * scale)], (4,), 0)
    for k in range(8):
        tw.decode(f"seq 2 + seq 4, step {k}", [(t(5000 + 100 * s + k), nxt(s), (s,), True) for s in (2, 4)])
    # the whole context restored as it was before seq_keep
    tw.state_set(state)
    for k in range(24):
        tw.decode(f"restored, four sequences, step {k}",
                  [(t(6000 + 100 * s + k), nxt(s), (s,), True) for s in (0, 1, 2, 3)])
    for k in range(16):
        tw.decode(f"restored, seq 0 alone, step {k}", [(t(7000 + k), nxt(0), (0,), True)])


def run(model: Path, *, page_size: int, threads: int, scale: int = 1, control: str | None = None) -> dict:
    """One comparison: paged (page_size) against unpaged, or with `control` ("threads": 1 against 2 threads,
    "layout": cells moved 16 further) unpaged against unpaged, llama.cpp's own spread."""
    tw = Twin(model, page_size=page_size, threads=threads, n_ctx=4096, n_batch=256, n_seq_max=6,
              control_threads=2 if control == "threads" else None, control_pad=16 if control == "layout" else 0)
    try:
        if tw.page_size() != (0 if control else page_size):
            raise RuntimeError(f"paged context runs with page size {tw.page_size()}, not {page_size}")
        toks = tw.off.tokenize(TEXT * 40, add_special=False, parse_special=False)
        t0 = time.perf_counter()
        workload(tw, toks, scale=scale)
        wall = time.perf_counter() - t0
        return {"compared": CONTROLS.get(control or "", "paged against unpaged"),
                "page_size": 0 if control else page_size, "threads": threads, **tw.summary(), "wall_s": round(wall, 1),
                "self_check_failures": tw.self_check_failures() if not control else None,
                "per_step": [asdict(s) for s in tw.steps]}
    finally:
        tw.close()


def report_lines(res: Path) -> list[str]:
    """The docs/benchmarks.md table of bench/results/paged_logits.json (for bench/report.py's paged section);
    [] when it was not measured."""
    path = res / "paged_logits.json"
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    out = [f"**Logit by logit** (`python -m bench.paged_logits`, model `{data['model']}`: the script's "
           f"{data['runs'][0]['positions']} output positions, unpaged context as the reference; the last rows are "
           "llama.cpp's own spread, unpaged against unpaged):", "",
           "| compared | page size | threads | max \\|Δlogit\\| | mean KL (nats) | max KL (nats) | top-1 differs |",
           "|---|---|---|---|---|---|---|"]
    for r in data["runs"]:
        out.append(f"| {r['compared']} | {r['page_size'] or '–'} | {r['threads']} | {r['max_abs']:.3g} | "
                   f"{r['kl_mean']:.2g} | {r['kl_max']:.2g} | {r['top1_differs']} |")
    return out + [""]


CONTROLS = {"threads": "unpaged, 1 thread against 2 threads",
            "layout": "unpaged against unpaged with its cells 16 further on"}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=None, help="GGUF model (default: the embedded SmolLM2-135M)")
    p.add_argument("--page-size", default="7,16", help="comma-separated page sizes")
    p.add_argument("--threads", default="1", help="comma-separated thread counts (both contexts)")
    p.add_argument("--controls", default="threads,layout",
                   help="unpaged-against-unpaged runs to measure llama.cpp's own spread (threads, layout; '' for none)")
    p.add_argument("--scale", type=int, default=1, help="multiplies the script's lengths")
    p.add_argument("--out", type=Path, default=Path("bench/results/paged_logits.json"))
    a = p.parse_args(argv)
    if a.model is None:
        from server.model_file import embedded_model_path

        a.model = embedded_model_path()
    runs = [run(a.model, page_size=int(ps), threads=int(th), scale=a.scale)
            for th in a.threads.split(",") for ps in a.page_size.split(",")]
    runs += [run(a.model, page_size=0, threads=1, scale=a.scale, control=c) for c in a.controls.split(",") if c]
    out = {"model": a.model.name, "machine": platform.machine(), "runs": runs}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=2) + "\n")
    for r in runs:
        print(f"{r['compared']}, page {r['page_size']} threads {r['threads']}: {r['positions']} positions, "
              f"max |dlogit| {r['max_abs']:.3g}, KL mean {r['kl_mean']:.3g} max {r['kl_max']:.3g} nats, "
              f"top-1 differs at {r['top1_differs']}, worst step: {r['worst_step']} ({r['wall_s']} s)"
              + (f", {r['self_check_failures']} ubatches failed the self-check" if r["self_check_failures"] is not None
                 else ""))


if __name__ == "__main__":
    main()
