"""The paged flash-attention kernel of a ggml backend checked against its dense kernel and against attention
computed in numpy, on random data laid out as a unified KV; then both timed from 4K to 128K cells.

    python -m bench.paged_kernel_check [--backend gpu|CPU|CUDA0] [--quick] [--time] [--out FILE]

Written for the first GPU host at hand (issue 33, item 4): bench/device_suite.sh runs it on the GPU, and once
more under compute-sanitizer with --quick; here it runs on the CPU backend (the tests do).

The check runs every combination of head size (64, 96, 128, 256), page size (7, 16, 64), query rows (1, 8, 64:
one decode row; eight sequences decoding; two decode rows beside a 62-token prompt chunk; and 124: four decode
rows beside a 120-token chunk, a prefill, which CUDA runs through the MMA kernel's gather over the page table,
its groups of rows mixed, of one sequence, and cut short at the end; that chunk is written into pages of its own, a
causal tail, so its rows' lists are prefixes of one another) and query heads per KV head (1, 4, 8; 2 KV
heads), over one layout (paged_layout): a prefix two sequences share, sequences with runs of their own and
cells scattered after evictions, an idle sequence's cells among them, the KV's last page cut short (pages of 7).
The page table carries llama.cpp's marks: GGML_FA_PAGE_UNMASKED, with a cut on a page the row's sequence fills from
its start and no further (exact page lengths: the cells after the cut are outside the row's pages). Per case:
  - paged: the op with the page table, on the backend, against the reference (max |difference|);
  - dense: the op without it (the kernels llama.cpp runs without pages), same backend, same reference;
  - poisoned: the paged op again with NaN written where the kernel must not read the mask: it must give the
    paged result bit for bit. Up to 64 rows (the decode kernels' contract) that is outside the row's pages and in
    its marked pages, cut cells included; above (a prefill) it is outside every page of the ubatch's rows: CUDA's
    gather takes a group of rows' pages together and reads the mask there (cut cells too), which llama.cpp writes
    whole when an accelerator is present.
A case passes when its outputs are finite, paged is within max(5e-3, 2 x dense's error) of the reference and
poisoned equals paged. The exit status is 1 when any case failed (2 when the backend cannot be opened).

--time measures paged (marked pages) and dense at an 8B model's attention (32 query heads, 8 KV heads, 128):
eight sequences decoding one row each over cells of their own, one sequence over all the cells, and a prompt
chunk of 512 rows (fewer where a sequence holds fewer cells) ending one of eight sequences (seed 002's TTFT shape)
or the only one (its pages are the whole KV: what the gather costs over dense), for --cells totals (default 4K
to 128K) and --page-sizes (default 16 and 64); the median of --iters runs after warm-up, each synchronised.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from harness.kernels import ggml_fa
from harness.kernels.ggml_backend import Backend, BackendUnavailable
from harness.kernels.paged_layout import UnifiedKV, mark_unmasked, ubatch_inputs

HEAD_SIZES = (64, 96, 128, 256)
PAGE_SIZES = (7, 16, 64)
ROWS = (1, 8, 64, 124)
DECODE_ROWS_MAX = 64  # above, a prefill (CUDA: GGML_CUDA_FATTN_PAGED_MAX_ROWS)
PREFILL_ROWS = 512
GQA = (1, 4, 8)
N_HEAD_KV = 2
N_KV = 1024  # llama.cpp pads the KV it attends to to 256 cells; pages of 7 cells: the last one is cut short
CHUNK_AT = 896  # where the 124-row layout's chunk starts: a page's first cell at 7, 16 and 64 cells a page
TOLERANCE = 5e-3


@dataclass(frozen=True)
class Case:
    head_size: int
    page_size: int
    rows: int
    gqa: int


@dataclass(frozen=True)
class CaseResult:
    case: Case
    paged_err: float
    dense_err: float
    poisoned_equal: bool
    ok: bool


def cases(quick: bool) -> list[Case]:
    heads, pages, gqa = ((64, 128), (7, 16), (1, 4)) if quick else (HEAD_SIZES, PAGE_SIZES, GQA)
    return [Case(d, p, r, g) for d, p, r, g in itertools.product(heads, pages, ROWS, gqa)]


def layout(rows: int, rng: np.random.Generator) -> tuple[UnifiedKV, list[tuple[int, int]]]:
    """The unified KV and the ubatch's tokens [(seq, pos)] for `rows` query rows (see the module's docstring)."""
    kv = UnifiedKV(N_KV, rng)
    if rows == 124:
        kv.reserve(CHUNK_AT, N_KV - CHUNK_AT)
    kv.append(0, 150, contiguous=True)
    kv.share(0, 1)
    kv.append(1, 60, contiguous=True)
    for s in range(2, 8):
        kv.append(s, 30 + 8 * s, contiguous=True)
    kv.append(9, 200)  # an idle slot's cells, scattered
    for s in (2, 3):
        kv.append(s, 20)  # placed wherever cells were free
    if rows == 1:
        kv.append(1, 1, contiguous=True)
        return kv, [(1, kv.next_pos[1] - 1)]
    if rows == 8:
        for s in range(8):
            kv.append(s, 1, contiguous=True)
        return kv, [(s, kv.next_pos[s] - 1) for s in range(8)]
    decoding, chunk = {64: ((0, 2), 62), 124: ((0, 1, 2, 3), 120)}[rows]
    for s in decoding:
        kv.append(s, 1, contiguous=True)
    # a prompt chunk's cells, written before attention runs: into the lowest free cells (among other sequences'), or
    # at 124 rows into pages of its own (a causal tail: each row's list ends at its own cell)
    kv.append(4, chunk, contiguous=True, at=CHUNK_AT if rows == 124 else None)
    return kv, [(s, kv.next_pos[s] - 1) for s in decoding] + [(4, kv.next_pos[4] - chunk + i) for i in range(chunk)]


def poison(mask: np.ndarray, marked: np.ndarray, page_size: int) -> np.ndarray:
    """The mask with NaN wherever the paged kernel must not read it. Up to DECODE_ROWS_MAX rows: outside each row's
    pages and inside its marked ones (with only the CPU kernel, llama.cpp leaves those entries unwritten). Above (a
    prefill): outside the pages of every row, since a backend may read a group of rows' pages together."""
    out = np.full_like(mask, np.nan)
    if len(marked) > DECODE_ROWS_MAX:
        pages = {int(p) & ggml_fa.GGML_FA_PAGE_INDEX for row in marked for p in row[2:2 + row[0]]}
        for p in pages:
            out[:, p * page_size:(p + 1) * page_size] = mask[:, p * page_size:(p + 1) * page_size]
        return out
    for i, row in enumerate(marked):
        for p in row[2:2 + row[0]]:
            if not p & ggml_fa.GGML_FA_PAGE_UNMASKED:
                out[i, p * page_size:(p + 1) * page_size] = mask[i, p * page_size:(p + 1) * page_size]
    return out


def run_case(case: Case, backend: Backend, kv: UnifiedKV, tokens: list[tuple[int, int]], mask: np.ndarray,
             table: np.ndarray, rng: np.random.Generator) -> CaseResult:
    """Paged, dense and poisoned for one case over the given layout and page table (marked or not)."""
    n_head = N_HEAD_KV * case.gqa
    q = rng.standard_normal((n_head, len(tokens), case.head_size), dtype=np.float32)
    k = rng.standard_normal((N_HEAD_KV, kv.n_kv, case.head_size), dtype=np.float32)
    v = rng.standard_normal((N_HEAD_KV, kv.n_kv, case.head_size), dtype=np.float32)
    kw = {"scale": 1.0 / np.sqrt(case.head_size), "backend": backend}
    ref = ggml_fa.reference(q, k, v, mask, scale=kw["scale"])
    paged = ggml_fa.flash_attn(q, k, v, mask, pages=table, page_size=case.page_size, **kw)
    dense = ggml_fa.flash_attn(q, k, v, mask, **kw)
    poisoned = ggml_fa.flash_attn(q, k, v, poison(mask, table, case.page_size), pages=table,
                                  page_size=case.page_size, **kw)
    finite = bool(np.isfinite(paged).all() and np.isfinite(dense).all())
    paged_err = float(np.abs(paged - ref).max()) if finite else float("inf")
    dense_err = float(np.abs(dense - ref).max()) if finite else float("inf")
    poisoned_equal = bool(np.array_equal(poisoned, paged))
    ok = finite and paged_err <= max(TOLERANCE, 2 * dense_err) and poisoned_equal
    return CaseResult(case, round(paged_err, 6), round(dense_err, 6), poisoned_equal, ok)


def check(backend: Backend, quick: bool, log=print) -> list[CaseResult]:
    rng = np.random.default_rng(0)
    results = []
    layouts: dict[int, tuple[UnifiedKV, list[tuple[int, int]]]] = {}
    inputs: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}  # (rows, page size): mask, marked table
    for case in cases(quick):
        if case.rows not in layouts:
            layouts[case.rows] = layout(case.rows, np.random.default_rng(case.rows))
        kv, tokens = layouts[case.rows]
        if (case.rows, case.page_size) not in inputs:
            mask, table = ubatch_inputs(kv, tokens, case.page_size)
            inputs[case.rows, case.page_size] = (mask, mark_unmasked(kv, tokens, table, case.page_size))
        mask, marked = inputs[case.rows, case.page_size]
        r = run_case(case, backend, kv, tokens, mask, marked, rng)
        results.append(r)
        if not r.ok:
            log(f"FAILED {asdict(case)}: paged {r.paged_err} dense {r.dense_err} poisoned_equal {r.poisoned_equal}")
    return results


def time_op(graph: ggml_fa.FlashAttnGraph, iters: int) -> float:
    for _ in range(3):
        graph.compute()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        graph.compute()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def prefill_inputs(n: int, seqs: int, page_size: int, rows: int, rng: np.random.Generator,
                   kv: tuple[np.ndarray, np.ndarray]) -> dict:
    """The 8B attention over `seqs` sequences of n/seqs cells each (runs of their own; K and V given, [8, n, 128]),
    for a prompt chunk of `rows` tokens ending the first sequence: its rows see that sequence's cells up to their own
    positions; every row lists that sequence's pages (one tag), those wholly before the chunk marked."""
    from harness.kernels.ggml_fa import GGML_FA_PAGE_UNMASKED

    per_seq = n // seqs
    first = per_seq - rows  # the chunk's first position (and cell: the first sequence holds cells 0..per_seq-1)
    mask = np.full((rows, n), -np.inf, dtype=np.float32)
    for i in range(rows):
        mask[i, :first + i + 1] = 0.0
    pages = list(range(-(-per_seq // page_size)))
    table = np.zeros((rows, 2 + -(-n // page_size)), dtype=np.int32)
    table[:, 0], table[:, 1] = len(pages), 0
    table[:, 2:2 + len(pages)] = [p | GGML_FA_PAGE_UNMASKED if (p + 1) * page_size - 1 <= first else p for p in pages]
    return {"q": rng.standard_normal((32, rows, 128), dtype=np.float32), "k": kv[0], "v": kv[1],
            "mask": mask, "marked": table}


def timings(backend: Backend, cells: list[int], page_sizes: list[int], iters: int, log=print) -> list[dict]:
    """Paged (marked) and dense ms at the 8B attention shape: 8 sequences x n/8 cells decoding one row each, 1
    sequence x n cells, and a prompt chunk ending the first of 8 sequences, then of the only one (where its pages
    cover the KV: what the gather costs over dense) (rows: PREFILL_ROWS, or the sequence's cells if fewer)."""
    from harness.kernels.fa_kernel import Shape, inputs

    out = []
    shapes = ((8, False), (1, False), (8, True), (1, True))
    kv: tuple[np.ndarray, np.ndarray] | None = None
    for n, page_size, (seqs, prefill) in itertools.product(cells, page_sizes, shapes):
        rng = np.random.default_rng(n)
        if kv is None or kv[0].shape[1] != n:  # drawn once per size: at 128K cells that is most of the host's time
            kv = (rng.standard_normal((8, n, 128), dtype=np.float32),
                  rng.standard_normal((8, n, 128), dtype=np.float32))
        rows = min(PREFILL_ROWS, n // seqs) if prefill else seqs
        if prefill:
            x = prefill_inputs(n, seqs, page_size, rows, rng, kv)
        else:
            x = inputs(Shape(f"8B, {seqs} x {n // seqs}", 32, 8, 128, seqs, n // seqs), rng, page_size, kv)
        kw = {"scale": 1.0 / np.sqrt(128), "backend": backend}
        with ggml_fa.FlashAttnGraph(x["q"], x["k"], x["v"], x["mask"], pages=x["marked"], page_size=page_size,
                                    **kw) as paged, \
                ggml_fa.FlashAttnGraph(x["q"], x["k"], x["v"], x["mask"], **kw) as dense:
            row = {"cells": n, "page_size": page_size, "seqs": seqs, "rows": rows,
                   "paged_ms": round(time_op(paged, iters), 4), "dense_ms": round(time_op(dense, iters), 4)}
        row["paged_over_dense"] = round(row["paged_ms"] / row["dense_ms"], 3)
        what = f"a {rows}-row chunk of 1 of {seqs} seq(s)" if prefill else f"{seqs} seq(s)"
        log(f"{n:>7} cells, pages of {page_size:>2}, {what}: paged {row['paged_ms']} ms, dense "
            f"{row['dense_ms']} ms ({row['paged_over_dense']}x)")
        out.append(row)
    return out


HEADING = "## The paged kernel against the dense one on random data (issue 33)"


def report_section(res: Path) -> list[str]:
    """The docs/benchmarks.md section (bench/report.py) from bench/results/paged_kernel_check.json."""
    out = [HEADING, ""]
    path = res / "paged_kernel_check.json"
    if not path.exists():
        return out + ["Not measured in this revision.", ""]
    data = json.loads(path.read_text())
    dev = data["backend"]
    args = list(data["args"])
    if "--out" in args:  # where the file went says nothing about the figures
        del args[args.index("--out"):args.index("--out") + 2]
    out += [f"`python -m bench.paged_kernel_check {' '.join(args)}` on {dev['name']} ({dev['description']}), "
            "one process."]
    if "cases" in data:
        cases = data["cases"]
        worst = max(cases, key=lambda c: c["paged_err"])
        out += ["", f"Check: **{len(cases) - data['failed']} of {len(cases)} cases passed** (head sizes, page sizes, "
                "query rows and GQA ratios crossed; shared, partial and marked pages; the poisoned mask equal bit "
                f"for bit). Largest paged error {worst['paged_err']:.4g} (dense {worst['dense_err']:.4g}) at head "
                f"size {worst['head_size']}, pages of {worst['page_size']}, {worst['rows']} rows, GQA {worst['gqa']}."]
    if data.get("timings"):
        out += ["", "Timing (8B attention: 32 query heads, 8 KV heads, 128; marked pages; median ms; rows: one per "
                "decoding sequence, or a prompt chunk of the first sequence):", "",
                "| cells | page size | sequences | query rows | paged ms | dense ms | paged / dense |",
                "|---|---|---|---|---|---|---|"]
        out += [f"| {t['cells']:,} | {t['page_size']} | {t['seqs']} | {t.get('rows', t['seqs'])} | "
                f"{t['paged_ms']:.3f} | {t['dense_ms']:.3f} | {t['paged_over_dense']:.2f}x |" for t in data["timings"]]
    return out + [""]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="gpu", help="a ggml device name (CPU, CUDA0) or 'gpu' for the first GPU")
    p.add_argument("--threads", type=int, default=2, help="the CPU backend's threads")
    p.add_argument("--quick", action="store_true", help="32 of the 144 cases (head sizes 64/128, pages 7/16, GQA 1/4)")
    p.add_argument("--no-check", dest="run_check", action="store_false", help="only time (with --time)")
    p.add_argument("--time", action="store_true", help="time paged against dense (see --cells)")
    p.add_argument("--cells", default="4096,8192,16384,32768,65536,131072")
    p.add_argument("--page-sizes", default="16,64")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--out", type=Path, default=Path("bench/results/paged_kernel_check.json"))
    a = p.parse_args(argv)
    try:
        backend = Backend(a.backend, a.threads)
    except BackendUnavailable as exc:
        print(f"paged_kernel_check: {exc}", file=sys.stderr)
        return 2
    if not ggml_fa.has_paged_op():
        print("paged_kernel_check: these ggml libraries have no paged flash attention (Arbor's patches)",
              file=sys.stderr)
        return 2
    result: dict = {"backend": asdict(backend.device), "lib": str(ggml_fa.lib_dir()), "tolerance": TOLERANCE,
                    "args": list(sys.argv[1:] if argv is None else argv)}
    with backend:
        if a.run_check:
            checked = check(backend, a.quick)
            result["cases"] = [{**asdict(r.case), **{k: v for k, v in asdict(r).items() if k != "case"}}
                               for r in checked]
            result["failed"] = sum(not r.ok for r in checked)
            worst = max(checked, key=lambda r: r.paged_err)
            print(f"paged_kernel_check on {backend.device.name} ({backend.device.description}): "
                  f"{len(checked) - result['failed']}/{len(checked)} cases passed; largest paged error "
                  f"{worst.paged_err} ({asdict(worst.case)}, dense {worst.dense_err})")
        if a.time:
            result["timings"] = timings(backend, [int(c) for c in a.cells.split(",")],
                                        [int(s) for s in a.page_sizes.split(",")], a.iters)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2))
    return 1 if result.get("failed") else 0

