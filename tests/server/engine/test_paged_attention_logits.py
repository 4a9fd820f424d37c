"""Paged attention against llama.cpp's attention over every cell, logit by logit, on the KV operations
the cache runs: a position shift (seq_add, including one that drops cells below position 0), seq_div,
seq_keep, seq_rm of a middle range, tokens written for several sequences at once (a batch entry with
n_seq_id > 1), a whole-context state saved and restored (llama_state_get/set_data and
state_seq_get/set(-1)), and paging turned on, resized and off again while cells exist. Each script runs
on two contexts of one random-weight model (bench/paged_logits.Twin), one paged with 7- or 16-cell
pages (7 puts page edges everywhere: pages shared by sequences, partly filled, clipped at n_kv), one
not; every output row of every decode is compared. The scripts reach the CPU kernel's three paths:
the tiled prefill (>= 64 rows), the per-row path (several sequences in one ubatch) and the split-KV
path (one row over n_kv >= 512 cells).

Tolerance. F32 weights (no F16 rounding of activations to amplify differences) and one thread (the
split-KV path then sums the same cells in the same order paged and unpaged) leave the tiled prefill's
other KV tile boundaries (paged tiles start at a page) and the F16 KV, where those ~1e-7 differences
now and then round a K or V value to the next F16: measured max |dlogit| 0-2.6e-5 over every script, on
logits of |x| <= 2.4 (std 0.22), KL <= 2e-11. MAX_ABS_DIFF = 2e-4 sits 8x above that, and far below what
one wrong cell does on this model: one foreign cell let into a 100-cell sequence's attention moves the
logits by 3.6e-2, positions 0-49 shifted by one by 3.1e-2 (test_the_tolerance_sees_one_wrong_cell keeps
that margin checked). Short runs of rows of one page list inside a tiled ubatch (a chunk's tail, decode
tokens beside a chunk) are short tiles in F32, as unpaged computes them (ops.cpp's short tiles; they took the F16
per-row path before, up to 1e-3 apart): test_short_runs_of_rows_match_unpaged.

Placement. Those bounds hold for the same cells in the same order, i.e. with llama.cpp's placement kept
(`page_placement="shared"`), which checks the kernel and the mask alone. With pages owned by one sequence
(native/src/llama-kv-pages.cpp, Twin's default; opt-in in the server) a sequence's tokens sit in other cells than
unpaged llama.cpp puts them, and llama.cpp itself moves logits by up to ~7e-4 when only the order of a sequence's cells
changes (test_cell_order_alone_moves_unpaged_logits): owned placement is held to LAYOUT_BOUND, 3x above that and 15x
below one wrong cell, plus equal top-1 everywhere. """

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import pytest

pytestmark = pytest.mark.model

PAGE_SIZES = (7, 16)
#: page size and placement of the paged twin: owned pages (the default) at both sizes, llama.cpp's placement once
LAYOUTS = [pytest.param(7, "owned", id="7-owned"), pytest.param(16, "owned", id="16-owned"),
           pytest.param(16, "shared", id="16-shared")]
THREADS = 1
MAX_ABS_DIFF = 2e-4
LAYOUT_BOUND = 2e-3
#: The per-row path (a decode ubatch of < 64 rows, paged or not) converts Q to F16 for the dot products and
#: accumulates V in F16: the same decode over the same cells in another order moves logits on this model by
#: up to 7.9e-4 (test_whole_state_restore's replay).
PER_ROW_BOUND = 5e-3
N_CTX = 1024  # n_kv is padded to 256 cells: above 256 used cells a one-token decode takes the split-KV path


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (run scripts/setup.sh)")
    from harness.models.synth_model import ModelShape, write_model
    from server.engine import paged_attention

    if not paged_attention.compiled_in():
        pytest.skip("llama-cpp-python was not built from Arbor's patched source")
    shape = ModelShape("llama", n_layer=2, n_embd=128, n_head=4, n_head_kv=2, n_ff=256, head_dim=32,
                       context_length=4096)
    return write_model(shape, "f32", tmp_path_factory.mktemp("paged-logits") / "llama-f32.gguf", seed=5)


@pytest.fixture(scope="module")
def toks(model) -> Callable[[int], int]:
    """Token i of a fixed random stream (ids of the embedded tokenizer's vocabulary, no special ones)."""
    stream = np.random.default_rng(11).integers(3, 49152, 20_000).tolist()
    return lambda i: stream[i % len(stream)]


@contextmanager
def twin(model, page_size: int, **kw) -> Iterator:
    from bench.paged_logits import Twin

    tw = Twin(model, page_size=page_size, n_ctx=N_CTX, n_batch=256, n_seq_max=6, threads=THREADS, **kw)
    try:
        yield tw
    finally:
        tw.close()


def assert_agree(tw, min_rows: int, placement: str = "shared") -> None:
    rows = sum(s.rows for s in tw.steps)
    assert rows >= min_rows, f"only {rows} output rows compared"
    worst = tw.worst()
    summary = (f"{rows} rows in {len(tw.steps)} decodes; worst: {worst.label!r}: max |dlogit| {worst.max_abs:.3g}, "
               f"KL max {worst.kl_max:.3g}, top-1 differs at {sum(s.top1_differs for s in tw.steps)} rows")
    print(summary)
    assert tw.self_check_failures() == 0, "a paged mask failed llama.cpp's self-check (its log names the cell)"
    assert worst.max_abs <= (MAX_ABS_DIFF if placement == "shared" else LAYOUT_BOUND), summary
    assert all(s.top1_differs == 0 for s in tw.steps), summary


def decode_steps(tw, toks, seqs, n: int, label: str, base: int = 9000) -> None:
    """n decode steps, one token for each of `seqs` per step, at each one's next position."""
    for k in range(n):
        tw.decode(f"{label}, step {k}",
                  [(toks(base + 100 * s + k), tw.pos_range(s)[1] + 1, (s,), True) for s in seqs])


def prefill(tw, toks, seq: int, n: int, base: int, chunk: int = 100, seqs: tuple[int, ...] | None = None) -> None:
    """n tokens for `seq` (or for all of `seqs`, one cell each) from its next position, in chunks."""
    start = tw.pos_range(seq)[1] + 1
    tw.prefill(f"seq {seqs or seq}", [toks(base + i) for i in range(n)], seqs or (seq,), start, chunk=chunk)


@pytest.mark.parametrize(("page_size", "placement"), LAYOUTS)
def test_seq_add_shifts(model, toks, page_size, placement):
    """llama.cpp's context shift (a middle range removed, the tail moved back), a gap opened by a forward
    shift, and a shift that takes cells below position 0 (they are freed); cells of two sequences interleaved."""
    with twin(model, page_size, page_placement=placement) as tw:
        prefill(tw, toks, 0, 100, 0)
        prefill(tw, toks, 1, 100, 1000)
        prefill(tw, toks, 0, 80, 2000, chunk=80)
        tw.memory("seq_rm", 0, 40, 70)
        tw.memory("seq_add", 0, 70, -1, -30)
        tw.memory("seq_add", 1, 50, -1, 25)
        tw.memory("seq_add", 1, 0, 10, -10)  # seq 1's first 10 cells go below 0: freed
        assert tw.pos_range(0) == (0, 149) and tw.pos_range(1) == (10, 124)
        decode_steps(tw, toks, (0, 1), 8, "seqs 0+1 after the shifts")
        prefill(tw, toks, 1, 72, 3000, chunk=72)
        decode_steps(tw, toks, (0,), 4, "seq 0 alone (split-KV)")
        tw.memory("seq_add", 0, 100, -1, 7)  # a shift between two decodes of the same sequence
        decode_steps(tw, toks, (0,), 4, "seq 0 after another shift", base=9500)
        assert_agree(tw, 300, placement)


@pytest.mark.parametrize(("page_size", "placement"), LAYOUTS)
def test_seq_div(model, toks, page_size, placement):
    """Positions divided (self-extend): a whole sequence by 2 (pairs of cells at one position), part of
    another by 3."""
    with twin(model, page_size, page_placement=placement) as tw:
        prefill(tw, toks, 0, 200, 0)
        prefill(tw, toks, 1, 120, 1000, chunk=120)
        tw.memory("seq_div", 0, 0, -1, 2)
        tw.memory("seq_div", 1, 60, -1, 3)
        assert tw.pos_range(0) == (0, 99) and tw.pos_range(1) == (0, 59)
        decode_steps(tw, toks, (0, 1), 8, "seqs 0+1 after seq_div")
        prefill(tw, toks, 0, 72, 2000, chunk=72)
        decode_steps(tw, toks, (1,), 4, "seq 1 alone (split-KV)")
        assert_agree(tw, 300, placement)


@pytest.mark.parametrize(("page_size", "placement"), LAYOUTS)
def test_seq_keep(model, toks, page_size, placement):
    """A prefix shared by seq_cp with three sequences and an unrelated idle one; seq_keep(1) frees every other
    sequence's cells (the shared ones stay, owned by 1 alone) and a new sequence fills the holes."""
    with twin(model, page_size, page_placement=placement) as tw:
        prefill(tw, toks, 0, 130, 0)
        tw.memory("seq_cp", 0, 1, -1, -1)
        tw.memory("seq_cp", 0, 2, 0, 64)
        prefill(tw, toks, 3, 90, 500, chunk=90)
        decode_steps(tw, toks, (0, 1), 6, "seqs 0+1 on the shared prefix")
        prefill(tw, toks, 2, 72, 1000, chunk=72)
        tw.memory("seq_keep", 1)
        assert tw.pos_range(0) == (-1, -1) and tw.pos_range(3) == (-1, -1) and tw.pos_range(1) == (0, 135)
        prefill(tw, toks, 4, 150, 2000, chunk=75)
        decode_steps(tw, toks, (1, 4), 8, "seqs 1+4 after seq_keep")
        decode_steps(tw, toks, (1,), 4, "seq 1 alone (split-KV)", base=9500)
        assert_agree(tw, 300, placement)


@pytest.mark.parametrize(("page_size", "placement"), LAYOUTS)
def test_seq_rm_middle_range(model, toks, page_size, placement):
    """seq_rm of a middle range (a gap in positions, cells freed in the middle of pages), of one cell, and of
    a range of a sharer (the cells stay, owned by the other); a new sequence reuses the freed cells."""
    with twin(model, page_size, page_placement=placement) as tw:
        prefill(tw, toks, 0, 200, 0)
        prefill(tw, toks, 1, 100, 1000)
        tw.memory("seq_cp", 1, 2, -1, -1)
        assert tw.memory("seq_rm", 0, 60, 130)
        assert tw.memory("seq_rm", 1, 30, 31)
        assert tw.memory("seq_rm", 2, 20, 60)
        prefill(tw, toks, 3, 90, 2000, chunk=90)
        decode_steps(tw, toks, (0, 1, 2, 3), 8, "four sequences")
        prefill(tw, toks, 0, 72, 3000, chunk=72)
        decode_steps(tw, toks, (2,), 4, "seq 2 alone (split-KV)")
        assert_agree(tw, 300, placement)


@pytest.mark.parametrize(("page_size", "placement"), LAYOUTS)
def test_tokens_in_several_sequences(model, toks, page_size, placement):
    """Batch entries with n_seq_id > 1 (one cell owned by every listed sequence; the token attends as its
    first one): a prompt written once for three sequences, two of them continuing together beside the third,
    then a token whose first sequence id is not the lowest."""
    with twin(model, page_size, page_placement=placement) as tw:
        tw.prefill("prompt for seqs 0+1+2", [toks(i) for i in range(100)], (0, 1, 2), 0, chunk=100)
        tw.decode("seqs 1+2 together beside seq 0",
                  [(toks(200 + k), 100 + k, (1, 2), True) for k in range(10)]
                  + [(toks(300 + k), 100 + k, (0,), True) for k in range(10)])
        decode_steps(tw, toks, (0, 1, 2), 6, "seqs 0, 1, 2 apart")
        assert tw.pos_range(0) == tw.pos_range(2) == (0, 115)
        for k in range(4):  # one cell for seqs 2 and 0, computed as seq 2's; seq 1 beside them
            tw.decode(f"a token of seqs (2, 0), step {k}", [(toks(400 + k), 116 + k, (2, 0), True),
                                                            (toks(500 + k), 116 + k, (1,), True)])
        prefill(tw, toks, 3, 120, 1000, chunk=120)
        decode_steps(tw, toks, (0, 2), 4, "seqs 0, 2 apart again")
        decode_steps(tw, toks, (0,), 4, "seq 0 alone (split-KV)", base=9500)
        assert_agree(tw, 200, placement)


@pytest.mark.parametrize(("page_size", "placement"), LAYOUTS)
@pytest.mark.parametrize("api", ["llama_state", "state_seq_-1"])
def test_whole_state_restore(model, toks, page_size, placement, api):
    """The whole context saved (llama_state_get_data, or state_seq_get(-1)) from the unpaged context over a
    busy KV (a shared prefix, a hole), the KV overwritten, the state restored into both (the paged context's
    page counts rebuilt from the restored cells): the continuation agrees paged and unpaged, and with the
    continuation before the overwrite."""
    with twin(model, page_size, page_placement=placement) as tw:
        prefill(tw, toks, 0, 150, 0, chunk=75)
        tw.memory("seq_cp", 0, 1, 0, 100)
        prefill(tw, toks, 1, 60, 1000, chunk=60)
        prefill(tw, toks, 2, 120, 2000, chunk=120)
        tw.memory("seq_rm", 2, 30, 60)
        if api == "llama_state":
            state = tw.state_get()
        else:
            state = bytes(tw.off.state_seq_get(-1))
        tw.keep_rows = True
        decode_steps(tw, toks, (0, 1, 2), 6, "before the overwrite")
        before = [off for off, _ in tw.rows]
        tw.memory("seq_keep", 2)
        prefill(tw, toks, 3, 250, 3000)
        tw.rows.clear()
        if api == "llama_state":
            tw.state_set(state)
        else:
            for rt in (tw.off, tw.on):
                assert rt.state_seq_set(state, -1)
        assert tw.pos_range(0) == (0, 149) and tw.pos_range(1) == (0, 159) and tw.pos_range(3) == (-1, -1)
        decode_steps(tw, toks, (0, 1, 2), 6, "after the restore")
        after = [off for off, _ in tw.rows]
        decode_steps(tw, toks, (1,), 4, "seq 1 alone after the restore", base=9500)
        assert_agree(tw, 300, placement)
        assert tw.page_size() == page_size
        # the restore puts the cells back from cell 0 up, so unpaged too sums them in other tiles than before
        # unpaged too: the restore closed seq 2's hole, so the decode tokens land in other cells than before (not
        # in the hole) and the per-row path sums the cells in another order: 7.9e-4, the F16 V accumulator's
        replay = max(float(np.abs(a - b).max()) for a, b in zip(before, after, strict=True))
        assert replay <= PER_ROW_BOUND, f"the continuation after the restore differs from before by {replay:.3g}"


@pytest.mark.parametrize(("page_size", "placement"), LAYOUTS)
def test_paging_turned_on_after_cells_exist(model, toks, page_size, placement):
    """The paged context starts unpaged; paging is turned on over a busy KV (shared cells, a hole, a K-shift
    pending), its page size changed, turned off and on again, with decodes between."""
    other = 16 if page_size == 7 else 7
    with twin(model, page_size, paged_later=True, page_placement=placement) as tw:
        assert tw.page_size() == 0
        prefill(tw, toks, 0, 130, 0, chunk=65)
        prefill(tw, toks, 1, 100, 1000)
        tw.memory("seq_cp", 0, 2, 0, 64)
        prefill(tw, toks, 2, 40, 2000, chunk=40)
        tw.memory("seq_rm", 1, 20, 50)
        tw.memory("seq_add", 0, 100, -1, 5)  # applied to the K at the next decode
        tw.set_page_size(page_size)
        decode_steps(tw, toks, (0, 1, 2), 6, f"paged ({page_size}) over existing cells")
        prefill(tw, toks, 1, 72, 3000, chunk=72)
        decode_steps(tw, toks, (0,), 3, "seq 0 alone (split-KV)", base=9300)
        tw.set_page_size(other)
        decode_steps(tw, toks, (0, 1, 2), 4, f"page size changed to {other}", base=9500)
        tw.set_page_size(0)
        decode_steps(tw, toks, (0, 2), 3, "paging off again", base=9600)
        tw.set_page_size(page_size)
        prefill(tw, toks, 2, 72, 4000, chunk=72)
        decode_steps(tw, toks, (0, 1, 2), 4, f"paged ({page_size}) again", base=9700)
        assert_agree(tw, 300, placement)


def short_runs_script(tw, toks) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Short runs of rows of one page list inside a tiled ubatch: the last 6 rows of a 70-row prompt chunk
    (after a full 64-row tile) and three decode tokens beside a 96-row prompt chunk (the scheduler's mixed
    ubatch). Returns the unpaged and paged logits of the 70-row chunk, then of the mixed ubatch."""
    tw.keep_rows = True
    prefill(tw, toks, 0, 100, 0)
    prefill(tw, toks, 1, 130, 1000, chunk=130)
    prefill(tw, toks, 2, 40, 2000, chunk=40)
    tw.rows.clear()
    tw.decode("a 70-row chunk of seq 2", [(toks(3000 + k), 40 + k, (2,), True) for k in range(70)])
    tw.decode("decode tokens of seqs 0, 1, 2 beside a 96-row chunk of seq 3",
              [(toks(4000 + 100 * s), tw.pos_range(s)[1] + 1, (s,), True) for s in (0, 1, 2)]
              + [(toks(5000 + k), k, (3,), True) for k in range(96)])
    (chunk_off, chunk_on), (mixed_off, mixed_on) = tw.rows
    return chunk_off, chunk_on, mixed_off, mixed_on


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_the_per_row_and_split_kv_paths_match_unpaged_bit_for_bit(model, toks, page_size):
    """Ubatches of fewer than 64 rows only (prompts in chunks of 40, decodes of three sequences, one sequence alone over
    > 512 cells), with llama.cpp's placement: paged, the per-row path takes the two query heads of each KV group in one
    pass over the cells (GQA packing, native/ggml/src/ggml-cpu/paged-flash-attn.cpp) and the split-KV path gives a
    thread's pages to both heads at once; unpaged walks every cell once per head. Per head the arithmetic and the cells'
    order are the same, so every logit is the same float, not merely close."""
    with twin(model, page_size, page_placement="shared") as tw:
        for seq in (0, 1, 2):
            prefill(tw, toks, seq, 90 + 30 * seq, 1000 * seq, chunk=40)
        decode_steps(tw, toks, (0, 1, 2), 8, "three sequences")
        prefill(tw, toks, 0, 480, 5000, chunk=40)
        decode_steps(tw, toks, (0,), 4, "seq 0 alone over > 512 cells (split-KV)", base=9500)
        decode_steps(tw, toks, (0, 2), 4, "seqs 0 and 2")
        assert tw.pos_range(0)[1] >= 512
        assert tw.self_check_failures() == 0
        rows = sum(s.rows for s in tw.steps)
        worst = tw.worst()
        assert rows >= 100, f"only {rows} rows compared"
        assert worst.max_abs == 0.0, f"{worst.label!r}: max |dlogit| {worst.max_abs:.3g}"


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_short_runs_of_rows_match_unpaged(model, toks, page_size):
    """Every row of those ubatches agrees within MAX_ABS_DIFF, the short runs too: paged, they are tiles of
    their own rows in F32 (ops.cpp's short tiles), as unpaged computes them. Before, they took the per-row path (F16 Q
    and V accumulator) and differed by up to 1e-3 (rows 64-69 of the chunk 9.8e-4, the decode rows 7.5e-4)."""
    with twin(model, page_size, page_placement="shared") as tw:
        chunk_off, chunk_on, mixed_off, mixed_on = short_runs_script(tw, toks)
    d_chunk = np.abs(chunk_on - chunk_off).max(axis=1)
    d_mixed = np.abs(mixed_on - mixed_off).max(axis=1)
    print(f"70-row chunk: rows 0-63 {d_chunk[:64].max():.3g}, rows 64-69 {d_chunk[64:].max():.3g}; mixed ubatch: "
          f"decode rows {d_mixed[:3].max():.3g}, prompt rows {d_mixed[3:].max():.3g}")
    assert d_chunk.max() <= MAX_ABS_DIFF and d_mixed.max() <= MAX_ABS_DIFF


def test_the_tolerance_sees_one_wrong_cell(model, toks):
    """What a mask or page error does on this model, unpaged: one cell of another sequence let into a
    sequence's attention, or positions 0-49 shifted down by one (the first cell dropped), moves the logits
    100x beyond MAX_ABS_DIFF."""
    from server.engine.llama_runtime import BatchEntry, LlamaRuntime, RuntimeConfig

    rt = LlamaRuntime(RuntimeConfig(model, n_ctx=N_CTX, n_batch=256, n_seq_max=2, n_threads=THREADS,
                                    n_threads_batch=THREADS, flash_attn=True, paged_attn="off"))
    try:
        def logits(wrong: str) -> np.ndarray:
            rt.seq_rm(-1, -1, -1)
            rt.decode([BatchEntry(toks(1000 + i), i, 1, False) for i in range(100)])
            rt.decode([BatchEntry(toks(i), i, 0, False) for i in range(100)])
            if wrong == "foreign cell":
                rt.seq_cp(1, 0, 50, 51)
            elif wrong == "shifted":
                import llama_cpp

                llama_cpp.llama_memory_seq_add(rt.memory, 0, 0, 50, -1)
            rt.decode([BatchEntry(toks(2000 + k), 100 + k, 0, True) for k in range(20)])
            return np.array(rt.logits_matrix(20))

        right = logits("")
        assert np.abs(logits("") - right).max() == 0  # the same script, the same logits
        for wrong in ("foreign cell", "shifted"):
            assert np.abs(logits(wrong) - right).max() > max(100 * MAX_ABS_DIFF, 10 * LAYOUT_BOUND), wrong
    finally:
        rt.close()


@pytest.mark.parametrize("self_check", [True, False], ids=["checked", "unchecked"])
def test_the_self_check_counts_a_wrong_mask(model, toks, self_check):
    """The self-check's failure counter against a real fault (inject_mask_fault, native/src/llama-kv-paged-mask.cpp):
    the next paged mask drops one cell that a token of sequence 0 may attend to, in a page whose mask is read. With
    llama.cpp's placement the two sequences' decode tokens share pages, so their rows read the mask there (in pages of
    its own a sequence reads none: with exact page lengths no decode row, with causal tails no prompt chunk's row
    either). The checked run counts exactly that ubatch, once (the fault is spent); unchecked, nothing counts it. Either
    way the dropped cell reaches the kernel: that decode's logits leave the owned-placement bound, so the counter counts
    a fault that matters."""
    from server.engine import paged_attention

    with twin(model, 16, page_placement="shared") as tw:
        paged_attention.set_self_check(tw.on.ctx, self_check)
        prefill(tw, toks, 0, 100, 0)
        prefill(tw, toks, 1, 60, 1000)
        decode_steps(tw, toks, (0, 1), 2, "before the fault")
        assert tw.self_check_failures() == 0
        assert tw.worst().max_abs <= LAYOUT_BOUND

        paged_attention.inject_mask_fault(tw.on.ctx)
        faulted = tw.decode("faulted", [(toks(5000), tw.pos_range(0)[1] + 1, (0,), True),
                                        (toks(5002), tw.pos_range(1)[1] + 1, (1,), True)])
        assert tw.self_check_failures() == (1 if self_check else 0)
        assert faulted.max_abs > 5 * LAYOUT_BOUND, faulted

        decode_steps(tw, toks, (0, 1), 2, "after the fault", base=6000)
        assert tw.self_check_failures() == (1 if self_check else 0)


def test_a_prompt_chunk_in_pages_of_its_own_reads_no_mask(model, toks):
    """Causality from positions (native/src/llama-kv-pages.h's causal tail): a prompt chunk written into pages of its
    sequence's own, here one that begins in the tail page of its prompt's last cells, is a causal tail, so each of its
    rows lists its pages up to its own cell and reads no mask. A mask fault armed before the chunk finds no mask entry
    the kernel reads, in the chunk or in the decodes after it: no count, no logit moves. It stays armed until a ubatch
    does read one: after seq_cp gives sequence 0 a single cell in a page of sequence 1, its decode row reads the mask in
    that page and takes the fault."""
    from server.engine import paged_attention

    with twin(model, 16) as tw:
        paged_attention.set_self_check(tw.on.ctx, True)
        prefill(tw, toks, 0, 100, 0)
        prefill(tw, toks, 1, 60, 1000)
        paged_attention.inject_mask_fault(tw.on.ctx)
        prefill(tw, toks, 0, 45, 2000, chunk=45)
        decode_steps(tw, toks, (0, 1), 2, "decode")
        assert tw.self_check_failures() == 0
        assert tw.worst().max_abs <= LAYOUT_BOUND

        tw.memory("seq_cp", 1, 0, 30, 31)  # sequence 1's cell at position 30, now sequence 0's too
        faulted = tw.decode("faulted", [(toks(5000), tw.pos_range(0)[1] + 1, (0,), True)])
        assert tw.self_check_failures() == 1
        assert faulted.max_abs > 5 * LAYOUT_BOUND, faulted


def test_cell_order_alone_moves_unpaged_logits(model, toks):
    """LAYOUT_BOUND's ground: unpaged llama.cpp, one sequence's 100 prompt cells and 4 decode tokens, the
    decode tokens written after the prompt's cells or before them (into the cells a removed sequence freed).
    The sequence's content is the same; only the order in which the kernel meets its cells differs."""
    from server.engine.llama_runtime import BatchEntry, LlamaRuntime, RuntimeConfig

    def decode_logits(hole_first: bool) -> np.ndarray:
        rt = LlamaRuntime(RuntimeConfig(model, n_ctx=N_CTX, n_batch=256, n_seq_max=6, n_threads=THREADS,
                                        n_threads_batch=THREADS, flash_attn=True, paged_attn="off"))
        try:
            if hole_first:
                rt.decode([BatchEntry(toks(5000 + i), i, 5, False) for i in range(40)])
            rt.decode([BatchEntry(toks(1000 + i), i, 1, False) for i in range(100)])
            rt.seq_rm(5)
            rows = []
            for k in range(4):
                rt.decode([BatchEntry(toks(9000 + k), 100 + k, 1, True)])
                rows.append(np.array(rt.logits_matrix(1)))
            return np.concatenate(rows)
        finally:
            rt.close()

    spread = float(np.abs(decode_logits(True) - decode_logits(False)).max())
    print(f"unpaged, decode cells before or after the prompt's: max |dlogit| {spread:.3g}")
    assert 0 < spread <= LAYOUT_BOUND / 2
