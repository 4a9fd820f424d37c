"""The CPU flash-attention kernel alone, timed: one decode ubatch of N sequences (one query row each)
over cells of their own in a unified KV, paged and unpaged, at the attention shapes of the models
Arbor runs.

    python -m bench.fa_kernel [--libs DIR_A,DIR_B] [--threads 2] [--iters 40] [--rounds 3]

Each sequence owns a run of cells after the previous one's (L cells, the first one's own length
where a shape gives it: one long sequence decoding beside short ones; pages of 16 cells); the mask
lets each row see its own cells. One row per sequence is the per-row path (several sequences) or
the split-KV path (one).
Within a process, paged and unpaged take turns, and (unless --no-marks, for libraries before patch
0014) paged with the pages marked GGML_FA_PAGE_UNMASKED as llama.cpp marks them (each page whose
cells from its start are the row's, its last one cut where the row's cells end (exact page lengths): all but
the page a sequence shares with the one before it), which the kernel computes without reading the
mask, and again with only the pages that need no cut marked (the rule before exact lengths: what the cut saves,
"cut_over_uncut"; --no-cuts times only that table, for libraries before 0022, which would read a
cut's bits as part of the page index); a figure is the median of --iters runs of the op (after 3
warm-up runs), and each round measures every shape once.

With --libs, each round runs that measurement once per folder of ggml libraries (a subprocess
with LLAMA_CPP_LIB_PATH set to it), in turns, so two builds of the patched library (before and
after a kernel change) are compared side by side on a noisy machine; the result file holds every
library's figures per round and, per shape, the median over rounds of the later library's paged
time over the first's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from harness.kernels.lib_folder import LibFolderError, check_lib_folder

PAGE_SIZE = 16
WARMUP = 3


@dataclass(frozen=True)
class Shape:
    name: str
    n_head: int
    n_head_kv: int
    head_dim: int
    seqs: int
    cells_per_seq: int
    first_seq_cells: int = 0  # the first sequence's length where it differs (0: cells_per_seq)
    head_dim_v: int = 0  # V's head size where it differs from K's (MLA; 0: head_dim)

    def lengths(self) -> list[int]:
        return [self.first_seq_cells or self.cells_per_seq] + [self.cells_per_seq] * (self.seqs - 1)


SHAPES = (
    Shape("smollm2-135m, 8 seqs x 2900", 9, 3, 64, 8, 2900),
    Shape("smollm2-135m, 1 seq x 2900 (split-KV)", 9, 3, 64, 1, 2900),
    Shape("synthetic 4x256, 8 seqs x 2900", 4, 2, 64, 8, 2900),
    Shape("8B (32 heads, 8 KV, 128), 8 seqs x 2048", 32, 8, 128, 8, 2048),
    Shape("smollm2-135m, 1 seq x 12000 beside 7 x 300", 9, 3, 64, 8, 300, first_seq_cells=12000),
    Shape("MLA (DeepSeek-V3 / Kimi: 128 heads, one 576/512 latent), 8 seqs x 600", 128, 1, 576, 8, 600,
          head_dim_v=512),
    Shape("MLA (128 heads), 1 seq x 3000 beside 7 x 200", 128, 1, 576, 8, 200, first_seq_cells=3000, head_dim_v=512),
)


def inputs(shape: Shape, rng: np.random.Generator, page_size: int = PAGE_SIZE,
           kv: tuple[np.ndarray, np.ndarray] | None = None) -> dict:
    """q, k, v, mask, the page table ("pages"), the same table with llama.cpp's marks ("marked") and with the marks
    of the pages that need no cut only ("marked_uncut": the rule before exact page lengths), for pages of page_size
    cells. `kv`: K and V to use (of the shape's sizes) instead of drawing new ones."""
    from harness.kernels.ggml_fa import GGML_FA_PAGE_CUT_SHIFT, GGML_FA_PAGE_UNMASKED

    rows, lengths = shape.seqs, shape.lengths()
    n_kv = sum(lengths)
    mask = np.full((rows, n_kv), -np.inf, dtype=np.float32)
    n_pages = -(-n_kv // page_size)
    table = np.zeros((rows, 2 + n_pages), dtype=np.int32)
    marked = table.copy()
    uncut = table.copy()
    for r in range(rows):
        first = sum(lengths[:r])
        end = first + lengths[r]
        mask[r, first:end] = 0.0
        pages = range(first // page_size, -(-end // page_size))
        table[r, 0], table[r, 1] = len(pages), r
        table[r, 2:2 + len(pages)] = list(pages)
        marked[r] = uncut[r] = table[r]
        for j, page in enumerate(pages):
            if first <= page * page_size:  # the row's cells from the page's start: marked, its tail page cut
                cut = max(0, (page + 1) * page_size - end)
                marked[r, 2 + j] |= GGML_FA_PAGE_UNMASKED | (cut << GGML_FA_PAGE_CUT_SHIFT)
                if cut == 0:
                    uncut[r, 2 + j] |= GGML_FA_PAGE_UNMASKED
    q = rng.standard_normal((shape.n_head, rows, shape.head_dim), dtype=np.float32)
    if kv is None:
        kv = (rng.standard_normal((shape.n_head_kv, n_kv, shape.head_dim), dtype=np.float32),
              rng.standard_normal((shape.n_head_kv, n_kv, shape.head_dim_v or shape.head_dim), dtype=np.float32))
    assert kv[0].shape == (shape.n_head_kv, n_kv, shape.head_dim)
    return {"q": q, "k": kv[0], "v": kv[1], "mask": mask, "pages": table, "marked": marked, "marked_uncut": uncut}


def op_ms(graph, threads: int, iters: int) -> float:
    times = []
    for i in range(iters + WARMUP):
        t0 = time.perf_counter()
        graph.compute(threads)
        if i >= WARMUP:
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def measure(shapes: tuple[Shape, ...], threads: int, iters: int, marks: bool = True,
            cuts: bool = True) -> dict[str, dict[str, float]]:
    """{shape name: {"paged_ms", "unpaged_ms"[, "paged_marked_ms"[, "paged_marked_uncut_ms"]]}} with the ggml
    libraries this process loaded; without `cuts` the marked table is "marked_uncut" (libraries before 0022)."""
    from harness.kernels.ggml_fa import FlashAttnGraph, has_paged_op

    if not has_paged_op():
        raise SystemExit("these ggml libraries have no paged flash attention (build Arbor's patched llama.cpp)")
    out = {}
    for shape in shapes:
        x = inputs(shape, np.random.default_rng(0))
        scale = 1.0 / np.sqrt(shape.head_dim)
        with FlashAttnGraph(x["q"], x["k"], x["v"], x["mask"], scale=scale, pages=x["pages"],
                            page_size=PAGE_SIZE) as paged, \
                FlashAttnGraph(x["q"], x["k"], x["v"], x["mask"], scale=scale) as unpaged:
            out[shape.name] = {"paged_ms": round(op_ms(paged, threads, iters), 4),
                               "unpaged_ms": round(op_ms(unpaged, threads, iters), 4)}
        if marks:
            with FlashAttnGraph(x["q"], x["k"], x["v"], x["mask"], scale=scale,
                                pages=x["marked" if cuts else "marked_uncut"], page_size=PAGE_SIZE) as marked:
                out[shape.name]["paged_marked_ms"] = round(op_ms(marked, threads, iters), 4)
        if marks and cuts:
            with FlashAttnGraph(x["q"], x["k"], x["v"], x["mask"], scale=scale, pages=x["marked_uncut"],
                                page_size=PAGE_SIZE) as uncut:
                out[shape.name]["paged_marked_uncut_ms"] = round(op_ms(uncut, threads, iters), 4)
    return out


def measure_with(lib_dir: str, threads: int, iters: int, marks: bool = True,
                 shapes: str = "", cuts: bool = True) -> dict[str, dict[str, float]]:
    """`measure` in a subprocess that loads the ggml libraries of `lib_dir` (shapes: --shapes' indices, "" for all)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "one.json"
        env = {**os.environ, "LLAMA_CPP_LIB_PATH": lib_dir}
        subprocess.run([sys.executable, "-m", "bench.fa_kernel", "--threads", str(threads), "--iters", str(iters),
                        "--rounds", "1", "--out", str(out), "--quiet"] + ([] if marks else ["--no-marks"])
                       + ([] if cuts else ["--no-cuts"]) + (["--shapes", shapes] if shapes else []),
                       env=env, check=True)
        return json.loads(out.read_text())["rounds"][0]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--libs", default="", help="comma-separated folders of ggml libraries to compare, first = base")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--iters", type=int, default=40)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--shapes", default="", help="comma-separated indices into SHAPES (default: all)")
    p.add_argument("--out", type=Path, default=Path("bench/results/fa_kernel.json"))
    p.add_argument("--no-marks", dest="marks", action="store_false",
                   help="skip the marked-pages variant (libraries built before unmasked pages, the old numbered "
                        "series' 0014, do not know the mark)")
    p.add_argument("--no-cuts", dest="cuts", action="store_false",
                   help="mark only pages that need no cut (libraries built before exact page lengths, the old "
                        "series' 0022, would read a cut's bits as part of the page index)")
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)
    shapes = tuple(SHAPES[int(i)] for i in a.shapes.split(",")) if a.shapes else SHAPES
    result: dict = {"threads": a.threads, "iters": a.iters, "page_size": PAGE_SIZE,
                    "shapes": [asdict(s) for s in shapes]}
    libs = [d for d in a.libs.split(",") if d]
    if len(set(libs)) != len(libs):
        raise SystemExit(f"--libs names a folder twice: {a.libs}")
    for d in libs:
        try:
            check_lib_folder(Path(d))
        except LibFolderError as exc:
            raise SystemExit(f"--libs: {exc}") from None
    if not libs:
        result["lib"] = os.environ.get("LLAMA_CPP_LIB_PATH", "llama_cpp's own")
        result["rounds"] = [measure(shapes, a.threads, a.iters, a.marks, a.cuts) for _ in range(a.rounds)]
        result["paged_over_unpaged"] = {
            s.name: statistics.median(r[s.name]["paged_ms"] / r[s.name]["unpaged_ms"] for r in result["rounds"])
            for s in shapes}
        if a.marks:
            result["marked_over_paged"] = {
                s.name: statistics.median(r[s.name]["paged_marked_ms"] / r[s.name]["paged_ms"]
                                          for r in result["rounds"])
                for s in shapes}
        if a.marks and a.cuts:
            result["cut_over_uncut"] = {
                s.name: statistics.median(r[s.name]["paged_marked_ms"] / r[s.name]["paged_marked_uncut_ms"]
                                          for r in result["rounds"])
                for s in shapes}
    else:
        rounds: dict[str, list] = {d: [] for d in libs}
        for _ in range(a.rounds):  # in turns, so drift on a shared machine hits every library alike
            for d in libs:
                rounds[d].append(measure_with(d, a.threads, a.iters, a.marks, a.shapes, a.cuts))
        result["libs"] = libs
        result["rounds"] = rounds
        base = libs[0]
        result["paged_over_base_lib"] = {
            d: {s.name: statistics.median(rounds[d][i][s.name]["paged_ms"] / rounds[base][i][s.name]["paged_ms"]
                                          for i in range(a.rounds)) for s in shapes}
            for d in libs[1:]}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2))
    if not a.quiet:
        print(json.dumps(result, indent=2))

