"""Paged attention on an MLA model (deepseek2, random weights from harness/models/synth_mla.py): llama.cpp runs MLA
through its K-only attention graph (V is a view of K), which the topic "llama: paged attention in the graph and the C
API" gives the page table; before it, that graph ran flash attention over every cell with the paged mask, which on a
CPU-only build is not written outside each sequence's pages, and read stale bytes there. The same KV operations on a
paged and an unpaged context must give the same logits at every position, with other sequences' cells in the KV, a
prefix shared by seq_cp and several sequences in one batch."""

from __future__ import annotations

import numpy as np
import pytest

from tests.server.engine.kv_probe import next_logits

pytestmark = pytest.mark.model

PAGE_SIZE = 16
# One thread: the split-KV decode path then sums the same cells in the same order paged and unpaged
# (with two, its chunks differ and its F16 V accumulator alone gives ~1e-3), and ggml's spinning
# threads crawl on cores shared with other tests.
THREADS = 1
# F32 weights (no F16 rounding of activations to amplify it): what is left is the tiled prefill's
# other tile boundaries and the F16 KV, ~3e-5 on logits of ~1 (the stale mask bytes of the bug: 1.5, then NaN).
MAX_ABS_DIFF = 2e-4


@pytest.fixture(scope="module")
def mla_model(tmp_path_factory):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (run scripts/setup.sh)")
    from harness.models.synth_mla import MLAShape, write_model

    return write_model(MLAShape(), tmp_path_factory.mktemp("mla") / "deepseek2-mla.gguf", type_name="f32", seed=3)


def runtime(model, paged: str):
    from server.engine.llama_runtime import LlamaRuntime, RuntimeConfig

    return LlamaRuntime(RuntimeConfig(model, n_ctx=1024, n_batch=256, n_seq_max=4, n_threads=THREADS,
                                      n_threads_batch=THREADS, flash_attn=True, kv_unified=True, paged_attn=paged,
                                      page_size=PAGE_SIZE))


def workload(rt) -> list[np.ndarray]:
    """Every logits row of a scripted mix of prefill and decode over a unified KV with other
    sequences' cells: the tiled prefill path, the per-row path (several sequences in one ubatch)
    and the split-KV path (one token over >= 512 cells) of the CPU kernel."""
    from server.engine.llama_runtime import BatchEntry

    rng = np.random.default_rng(7)
    a, b, c, d = (rng.integers(3, rt.n_vocab, n).tolist() for n in (100, 150, 60, 40))
    out: list[np.ndarray] = []

    def step(entries: list[BatchEntry]) -> None:
        out.append(np.array(rt.logits_matrix(len(rt.decode(entries)))))

    step([BatchEntry(t, i, 0, True) for i, t in enumerate(a)])           # seq 0: prompt A
    step([BatchEntry(t, i, 1, True) for i, t in enumerate(b)])           # seq 1: prompt B, above A
    for k in range(8):                                                   # seq 1 decodes alone
        step([BatchEntry(c[k], len(b) + k, 1, True)])
    rt.seq_cp(0, 2)                                                      # seq 2 shares A's cells ...
    step([BatchEntry(c[8 + k], len(a) + k, 0, True) for k in range(20)]  # ... both continue in one batch
         + [BatchEntry(d[k], len(a) + k, 2, True) for k in range(20)])
    step([BatchEntry(t, i, 3, True) for i, t in enumerate(c)])           # seq 3: a prompt above the others
    for k in range(8):                                                   # three sequences decode at once
        step([BatchEntry(d[20 + k], len(a) + 20 + k, 0, True),
              BatchEntry(c[28 + k], len(b) + 8 + k, 1, True),
              BatchEntry(d[28 + k], len(a) + 20 + k, 2, True)])
    for k in range(4):                                                   # one token over n_kv = 512
        step([BatchEntry(c[40 + k], len(c) + k, 3, True)])
    return out


def test_mla_paged_logits_match_unpaged(mla_model):
    logits = {}
    for mode in ("off", "on"):
        rt = runtime(mla_model, mode)
        try:
            assert rt.info.architecture == "deepseek2"
            # the K-only (MLA) graph is the one under test: paging must really be on for it
            assert rt.paged_attn.enabled == (mode == "on"), rt.paged_attn
            if mode == "on":
                from server.engine import paged_attention

                paged_attention.set_self_check(rt.ctx, True)
            logits[mode] = np.concatenate(workload(rt))
            if mode == "on":  # every paged mask of the K-only graph agreed with llama.cpp's own inside the pages
                assert paged_attention.self_check_failures(rt.ctx) == 0
        finally:
            rt.close()
    off, on = logits["off"], logits["on"]
    assert off.shape == on.shape and np.isfinite(off).all()
    diff = np.abs(on - off)
    diff[~np.isfinite(diff)] = np.inf  # NaN logits (attention over stale mask bytes) count as the worst
    worst = np.unravel_index(int(np.argmax(diff)), diff.shape)
    top1_off, top1_on = off.argmax(axis=1), on.argmax(axis=1)
    summary = (f"max |dlogit| {diff.max():.3g} at row {worst[0]} of {len(off)}, median {np.median(diff):.3g}, "
               f"{int((~np.isfinite(on)).any(axis=1).sum())} rows not finite, "
               f"top-1 differs at {int((top1_off != top1_on).sum())} rows")
    assert diff.max() <= MAX_ABS_DIFF, summary
    assert (top1_off == top1_on).all(), summary


def test_defragmentation_moves_k_only_cells(mla_model):
    """Defragmentation (native/src/llama-kv-defrag.cpp) on a K-only (MLA) cache, whose layers have no V tensor: the
    cells a full cache made a minority in their pages move, and each moved sequence's next logits are those it had
    before the move."""
    from server.engine.llama_runtime import BatchEntry, LlamaRuntime, RuntimeConfig

    rt = LlamaRuntime(RuntimeConfig(mla_model, n_ctx=256, n_batch=256, n_seq_max=9, n_threads=THREADS,
                                    n_threads_batch=THREADS, flash_attn=True, kv_unified=True, paged_attn="on",
                                    page_size=PAGE_SIZE, page_placement="owned"))
    try:
        assert rt.n_ctx == 256 and rt.paged_attn.enabled
        rng = np.random.default_rng(11)
        for s in range(8):  # 8 x (a full page + one cell): every page in use
            rt.decode([BatchEntry(int(t), i, s, i == 16) for i, t in enumerate(rng.integers(3, rt.n_vocab, 17))])
        rt.decode([BatchEntry(int(t), i, 8, i == 39) for i, t in enumerate(rng.integers(3, rt.n_vocab, 40))])
        theirs = set(rt.seq_pages(8))
        holders = [s for s in range(8) if set(rt.seq_pages(s)) & theirs]

        before = {s: next_logits(rt, s, 17, 5) for s in holders}
        for s in [s for s in range(8) if s not in holders][:4]:
            assert rt.seq_rm(s)
        assert rt.defragment_pages() == len(holders) > 0
        for s in holders:
            assert not set(rt.seq_pages(s)) & set(rt.seq_pages(8))
            assert float(np.abs(next_logits(rt, s, 17, 5) - before[s]).max()) <= MAX_ABS_DIFF
    finally:
        rt.close()
