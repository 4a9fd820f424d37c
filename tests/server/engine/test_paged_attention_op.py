"""The paged flash-attention operator (our llama.cpp patch) against masked attention computed
in numpy, on random data laid out as a unified KV: several sequences in one ubatch, ragged
lengths, a prefix whose cells two sequences share, cells of a sequence outside the ubatch,
pages cut at odd sizes; the prefill (tiled), multi-sequence decode and one-token split-KV
paths of the CPU kernel."""

from __future__ import annotations

import numpy as np
import pytest

from harness.kernels import ggml_fa
from harness.kernels.paged_layout import UnifiedKV, mark_unmasked, ubatch_inputs

pytestmark = pytest.mark.skipif(not ggml_fa.has_paged_op(),
                                reason="llama-cpp-python was built without Arbor's paged attention patch")

DK = DV = 64
N_HEAD, N_HEAD_KV = 6, 2


def random_qkv(rng, n_tokens: int, n_kv: int):
    q = rng.standard_normal((N_HEAD, n_tokens, DK)).astype(np.float32)
    k = rng.standard_normal((N_HEAD_KV, n_kv, DK)).astype(np.float32)
    v = rng.standard_normal((N_HEAD_KV, n_kv, DV)).astype(np.float32)
    return q, k, v


def shared_prefix_layout(rng, n_kv: int) -> UnifiedKV:
    """seq 0: a 200-cell prefix; seq 1 attaches it and adds 90; seq 2 has 150 of its own;
    seq 7 (an idle slot, not in the ubatch) holds 300 cells spread over the pool."""
    kv = UnifiedKV(n_kv, rng)
    kv.append(0, 200)
    kv.share(0, 1)
    kv.append(1, 90)
    kv.append(2, 150)
    kv.append(7, 300)
    return kv


SCALE = 1.0 / np.sqrt(DK)


def check(kv: UnifiedKV, tokens, page_size: int, rng, n_threads: int = 2):
    mask, table = ubatch_inputs(kv, tokens, page_size)
    q, k, v = random_qkv(rng, len(tokens), kv.n_kv)
    ref = ggml_fa.reference(q, k, v, mask, scale=SCALE)
    paged = ggml_fa.flash_attn(q, k, v, mask, scale=SCALE, pages=table, page_size=page_size, n_threads=n_threads)
    unpaged = ggml_fa.flash_attn(q, k, v, mask, scale=SCALE, n_threads=n_threads)
    np.testing.assert_allclose(paged, ref, atol=4e-3, rtol=0)
    np.testing.assert_allclose(paged, unpaged, atol=4e-3, rtol=0)
    return q, k, v, mask, table


@pytest.mark.parametrize("page_size", [16, 7, 64])
def test_prefill_ubatch_of_several_sequences(page_size):
    """80 new tokens (the tiled path: at least 64 query rows): 70 of seq 1 over the shared
    prefix, 10 of seq 2; a Q tile spans both sequences."""
    rng = np.random.default_rng(page_size)
    kv = shared_prefix_layout(rng, 1000)
    tokens = [(1, p) for p in range(290 - 70, 290)]
    tokens += [(2, p) for p in range(140, 150)]
    check(kv, tokens, page_size, rng)


@pytest.mark.parametrize("page_size", [16, 5])
def test_decode_several_sequences(page_size):
    """One token each for seqs 0, 1, 2 (the per-row path); seq 0 and 1 share the prefix pages."""
    rng = np.random.default_rng(100 + page_size)
    kv = shared_prefix_layout(rng, 900)
    for s in (0, 1, 2):
        kv.append(s, 1)
    tokens = [(0, kv.next_pos[0] - 1), (1, kv.next_pos[1] - 1), (2, kv.next_pos[2] - 1)]
    check(kv, tokens, page_size, rng)


@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_decode_one_token_split_kv(n_threads):
    """One query row over at least 512 cells: the threads split the page list (split-KV path),
    with a last page cut short by the end of the KV."""
    rng = np.random.default_rng(7 + n_threads)
    kv = shared_prefix_layout(rng, 1003)
    kv.append(1, 1)
    check(kv, [(1, kv.next_pos[1] - 1)], 32, rng, n_threads=n_threads)


def test_page_boundaries_contiguous_cells():
    """A sequence laid out contiguously from an odd cell: its first and last pages are partly
    other sequences' cells, which the mask still drops inside the page."""
    rng = np.random.default_rng(3)
    kv = UnifiedKV(700, rng)
    kv.append(9, 37, contiguous=True)
    kv.append(4, 300, contiguous=True)
    kv.append(9, 20, contiguous=True)
    tokens = [(4, p) for p in range(230, 300)]
    check(kv, tokens, 16, rng)


def test_missing_page_changes_the_result():
    """The kernel really reads only the listed pages: dropping a page that holds visible cells
    changes the answer (and keeping it gives the reference)."""
    rng = np.random.default_rng(11)
    kv = shared_prefix_layout(rng, 800)
    kv.append(1, 1)
    tokens = [(1, kv.next_pos[1] - 1)]
    q, k, v, mask, table = check(kv, tokens, 16, rng)
    n = table[0, 0]
    assert n >= 2
    dropped = table.copy()
    dropped[0, 0] = n - 1
    dropped[0, 2:n + 1] = table[0, 3:n + 2]  # drop the first page
    out = ggml_fa.flash_attn(q, k, v, mask, scale=SCALE, pages=dropped, page_size=16)
    ref = ggml_fa.reference(q, k, v, mask, scale=SCALE)
    assert np.abs(out - ref).max() > 1e-2


@pytest.mark.parametrize("tokens_of", ["prefill", "decode", "one"])
def test_the_cpu_kernel_never_reads_the_mask_outside_a_rows_pages(tokens_of):
    """llama.cpp leaves the mask unwritten outside each token's pages when only the CPU kernel runs:
    with every such entry set to 0 (visible), the paged result must still be the reference."""
    rng = np.random.default_rng({"prefill": 21, "decode": 22, "one": 23}[tokens_of])
    kv = shared_prefix_layout(rng, 1100)
    for s in (0, 1, 2):
        kv.append(s, 1)
    if tokens_of == "prefill":  # the tiled path, two sequences in one Q tile
        tokens = [(1, p) for p in range(kv.next_pos[1] - 60, kv.next_pos[1])]
        tokens += [(2, p) for p in range(kv.next_pos[2] - 10, kv.next_pos[2])]
    elif tokens_of == "decode":  # the per-row path
        tokens = [(s, kv.next_pos[s] - 1) for s in (0, 1, 2)]
    else:  # the split-KV path
        tokens = [(1, kv.next_pos[1] - 1)]
    page_size = 16
    mask, table = ubatch_inputs(kv, tokens, page_size)
    garbage = mask.copy()
    for i, row in enumerate(table):
        inside = np.zeros(kv.n_kv, dtype=bool)
        for p in row[2:2 + row[0]]:
            inside[p * page_size:(p + 1) * page_size] = True
        garbage[i, ~inside] = 0.0
    q, k, v = random_qkv(rng, len(tokens), kv.n_kv)
    ref = ggml_fa.reference(q, k, v, mask, scale=SCALE)
    paged = ggml_fa.flash_attn(q, k, v, garbage, scale=SCALE, pages=table, page_size=page_size)
    np.testing.assert_allclose(paged, ref, atol=4e-3, rtol=0)
    unpaged = ggml_fa.flash_attn(q, k, v, garbage, scale=SCALE)  # without the table the garbage shows
    assert np.abs(unpaged - ref).max() > 1e-2


def test_decode_rows_beside_a_prefill_chunk():
    """The scheduler's mixed ubatch: one decode token of two sequences, then 70 prompt tokens of a
    third. Each decode row is a one-row tile over its own pages (ops.cpp's short tiles), the chunk tiles of its own."""
    rng = np.random.default_rng(31)
    kv = shared_prefix_layout(rng, 1200)
    kv.append(0, 1)
    kv.append(2, 1)
    kv.append(4, 70)  # the prompt chunk's cells, written before attention runs
    tokens = [(0, kv.next_pos[0] - 1), (2, kv.next_pos[2] - 1)] + [(4, p) for p in range(70)]
    check(kv, tokens, 16, rng)


def rows_beside_one_row(rng) -> tuple[UnifiedKV, list[list[tuple[int, int]]]]:
    """shared_prefix_layout over 1,100 cells with one new token for seqs 0-3 and for seq 4 (which shares seq 0's
    prefix): the per-row path's ubatch (those 5 tokens) and the split-KV path's (seq 1's token alone)."""
    kv = shared_prefix_layout(rng, 1100)
    for s in (0, 1, 2, 3):
        kv.append(s, 1)
    kv.share(0, 4)
    kv.append(4, 1)
    return kv, [[(s, kv.next_pos[s] - 1) for s in (0, 1, 2, 3, 4)], [(1, kv.next_pos[1] - 1)]]


@pytest.mark.parametrize("n_head", [6, 8, 4])
@pytest.mark.parametrize("n_threads", [1, 2, 3])
@pytest.mark.parametrize("extras", ["plain", "softcap+sinks"])
def test_grouped_heads_in_one_pass_are_exact(n_head, n_threads, extras):
    """Paged, the per-row and split-KV paths take the query heads of a KV group in one pass over the cells
    (native/ggml/src/ggml-cpu/paged-flash-attn.cpp; groups of 3, 4 and 2 here, over 2 KV heads). Per head the arithmetic
    and the cells' order are those of the unpaged path, so the result is the same float, with a soft-cap and sinks too
    (sinks apply once, in the first KV chunk). Threads take chunks of whole groups (5 rows of 6 heads over 3 threads: 30
    items in chunks of 3). The split-KV path sums per-thread partials over other cell ranges than unpaged with several
    threads, so there it is held to the reference."""
    rng = np.random.default_rng(1000 + 10 * n_head + n_threads)
    kv, ubatches = rows_beside_one_row(rng)
    page_size = 16
    softcap = 20.0 if extras != "plain" else 0.0
    sinks = rng.standard_normal(n_head).astype(np.float32) if extras != "plain" else None
    for tokens in ubatches:
        mask, table = ubatch_inputs(kv, tokens, page_size)
        q = rng.standard_normal((n_head, len(tokens), DK)).astype(np.float32)
        _, k, v = random_qkv(rng, len(tokens), kv.n_kv)
        kw = {"scale": SCALE, "softcap": softcap, "sinks": sinks}
        paged = ggml_fa.flash_attn(q, k, v, mask, pages=table, page_size=page_size, n_threads=n_threads, **kw)
        unpaged = ggml_fa.flash_attn(q, k, v, mask, n_threads=n_threads, **kw)
        ref = ggml_fa.reference(q, k, v, mask, **kw)
        np.testing.assert_allclose(paged, ref, atol=4e-3, rtol=0)
        if len(tokens) > 1 or n_threads == 1:
            np.testing.assert_array_equal(paged, unpaged)


# (query heads, KV heads, DK, DV): MHA (one query head per KV head), groups of 20 and 32 over 2 KV heads, and MLA's
# shape (one KV head under 32 query heads, K wider than V, as DeepSeek's latent attention reads V as a view of K)
HEAD_SHAPES = [(2, 2, 64, 64), (40, 2, 64, 64), (64, 2, 64, 64), (32, 1, 96, 64)]


@pytest.mark.parametrize("shape", HEAD_SHAPES, ids=["mha", "gqa20", "gqa32", "mla"])
@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_groups_of_any_size_are_walked_in_passes_bit_for_bit(shape, n_threads):
    """Every GQA ratio takes the packed per-row path, in passes of at most 16 heads of one KV group (MHA:
    one head; a group of 20: passes of 10; of 32, and MLA's single group of 32: passes of 16). Per head the arithmetic
    and the cells' order are the unpaged path's: several rows of similar lengths (none long enough for the plan to cut)
    are the same float, and one row over 1,100 cells (the split-KV path) is with one thread and within the reference's
    tolerance with more."""
    n_head, n_head_kv, dk, dv = shape
    rng = np.random.default_rng(3000 + 10 * n_head + n_threads)
    kv, ubatches = rows_beside_one_row(rng)
    page_size = 16
    for tokens in ubatches:
        mask, table = ubatch_inputs(kv, tokens, page_size)
        q = rng.standard_normal((n_head, len(tokens), dk)).astype(np.float32)
        k = rng.standard_normal((n_head_kv, kv.n_kv, dk)).astype(np.float32)
        v = rng.standard_normal((n_head_kv, kv.n_kv, dv)).astype(np.float32)
        scale = 1.0 / np.sqrt(dk)
        paged = ggml_fa.flash_attn(q, k, v, mask, scale=scale, pages=table, page_size=page_size, n_threads=n_threads)
        unpaged = ggml_fa.flash_attn(q, k, v, mask, scale=scale, n_threads=n_threads)
        np.testing.assert_allclose(paged, ggml_fa.reference(q, k, v, mask, scale=scale), atol=4e-3, rtol=0)
        if len(tokens) > 1 or n_threads == 1:
            np.testing.assert_array_equal(paged, unpaged)


def contiguous_prefix_layout(rng, n_kv: int, kv: UnifiedKV | None = None) -> UnifiedKV:
    """shared_prefix_layout with each sequence's cells in a run (as a prompt's are): most of their pages hold
    only the sequence's cells; seq 7's idle cells stay scattered over the pool (over `kv`'s free cells if given)."""
    kv = kv or UnifiedKV(n_kv, rng)
    kv.append(0, 200, contiguous=True)
    kv.share(0, 1)
    kv.append(1, 90, contiguous=True)
    kv.append(2, 150, contiguous=True)
    rng.shuffle(kv.free)
    kv.append(7, 300)
    return kv


@pytest.mark.parametrize("tokens_of", ["prefill", "decode", "one", "mixed", "tail", "tail-mixed", "tail-short"])
def test_pages_marked_unmasked_are_computed_without_reading_the_mask(tokens_of):
    """Unmasked pages: llama.cpp marks the pages whose mask is 0 for every token of the row's sequence and leaves the
    mask unwritten there (exact page lengths: also a page whose first cells are the sequence's, cut where they end).
    With NaN written into those pages' mask (what a read would turn into NaN outputs) the paged result is the unmarked
    table's over the true mask, bit for bit: the tiled (prefill, a decode row beside a prompt chunk), per-row
    (decode) and split-KV (one row) paths skip the mask there and add nothing. Causal tails: a prompt chunk in pages of
    its sequence's own ("tail": 70 rows, a 64-row tile and a 6-row one; "tail-mixed": beside two decode rows;
    "tail-short": 30 rows, the per-row path) is a causal tail, each row's list ending at its own cell, so no row of
    it reads a mask."""
    rng = np.random.default_rng({"prefill": 41, "decode": 42, "one": 43, "mixed": 44, "tail": 45,
                                 "tail-mixed": 46, "tail-short": 47}[tokens_of])
    own = None
    if tokens_of.startswith("tail"):
        own = UnifiedKV(1200, rng)
        own.reserve(960, 240)  # pages 60-74 at 16 cells a page: sequence 4's own
    kv = contiguous_prefix_layout(rng, 1200, own)
    for s in (0, 1, 2):
        kv.append(s, 1, contiguous=True)
    if tokens_of == "prefill":
        tokens = [(1, p) for p in range(kv.next_pos[1] - 70, kv.next_pos[1])]
    elif tokens_of == "decode":
        tokens = [(s, kv.next_pos[s] - 1) for s in (0, 1, 2)]
    elif tokens_of == "one":
        tokens = [(1, kv.next_pos[1] - 1)]
    elif tokens_of == "mixed":
        kv.append(4, 70, contiguous=True)
        tokens = [(0, kv.next_pos[0] - 1), (2, kv.next_pos[2] - 1)] + [(4, p) for p in range(70)]
    else:
        n_chunk = 30 if tokens_of == "tail-short" else 70
        kv.append(4, 37, at=960)  # its prompt, then a chunk continuing it in the same pages
        chunk_cells = kv.append(4, n_chunk, at=997)
        tokens = [(4, p) for p in range(37, 37 + n_chunk)]
        if tokens_of == "tail-mixed":
            tokens = [(0, kv.next_pos[0] - 1), (2, kv.next_pos[2] - 1)] + tokens
    page_size = 16
    mask, table = ubatch_inputs(kv, tokens, page_size)
    marked = mark_unmasked(kv, tokens, table, page_size)
    flagged = (marked[:, 2:] & ggml_fa.GGML_FA_PAGE_UNMASKED) != 0
    assert flagged.sum() >= 10  # the earlier pages of the sequences that had cells before this ubatch
    cut = [ggml_fa.page_cut(p) for p in marked[:, 2:][flagged]]
    assert any(cut) == (tokens_of != "prefill")  # exact page lengths: a decode row's pages filled from their start, cut
    chunk = [i for i, (s, _) in enumerate(tokens) if s == 4]
    if tokens_of.startswith("tail"):  # every page of every chunk row marked, the rows' lists of several lengths
        assert all(marked[i, 2 + j] & ggml_fa.GGML_FA_PAGE_UNMASKED for i in chunk for j in range(marked[i, 0]))
        assert len({int(marked[i, 0]) for i in chunk}) == len({c // page_size for c in chunk_cells})
    unwritten = mask.copy()
    for i, row in enumerate(marked):
        for p in row[2:2 + row[0]]:
            if p & ggml_fa.GGML_FA_PAGE_UNMASKED:
                page, end = p & ggml_fa.GGML_FA_PAGE_INDEX, (p & ggml_fa.GGML_FA_PAGE_INDEX) * page_size + page_size
                assert (mask[i, page * page_size:end - ggml_fa.page_cut(p)] == 0).all()
                assert (mask[i, end - ggml_fa.page_cut(p):end] == -np.inf).all()
                unwritten[i, page * page_size:end] = np.nan
    q, k, v = random_qkv(rng, len(tokens), kv.n_kv)
    expected = ggml_fa.flash_attn(q, k, v, mask, scale=SCALE, pages=table, page_size=page_size)
    np.testing.assert_allclose(expected, ggml_fa.reference(q, k, v, mask, scale=SCALE), atol=4e-3, rtol=0)
    got = ggml_fa.flash_attn(q, k, v, unwritten, scale=SCALE, pages=marked, page_size=page_size)
    np.testing.assert_array_equal(got, expected)
    read = ggml_fa.flash_attn(q, k, v, unwritten, scale=SCALE, pages=table, page_size=page_size)
    assert np.isnan(read).any()  # without the marks the kernel reads those NaNs


@pytest.mark.parametrize("n_threads", [2, 3])
@pytest.mark.parametrize("extras", ["plain", "softcap+sinks"])
@pytest.mark.parametrize("shape", [(N_HEAD, N_HEAD_KV, DK, DV), HEAD_SHAPES[0], HEAD_SHAPES[3]],
                         ids=["gqa3", "mha", "mla"])
def test_a_long_row_beside_short_ones_is_cut_among_the_threads(n_threads, extras, shape):
    """The per-row path planned per batch (paged-flash-attn.cpp's plan; MHA's and MLA's shapes too): one decode row over
    1,500 cells beside three short ones would leave threads idle while one walks the long row's passes; the plan cuts
    each long pass into pieces of pages, computes them on any thread and combines them per head (sinks once). The result
    is the reference's; that the cut really ran shows in the last bits: the long row is no longer the same float as
    unpaged (whose cells one thread sums in order), while the short rows, not cut, still are."""
    n_head, n_head_kv, dk, dv = shape
    rng = np.random.default_rng(2000 + n_threads + n_head)
    kv = UnifiedKV(1700, rng)
    kv.append(0, 1500, contiguous=True)
    for s in (1, 2, 3):
        kv.append(s, 30, contiguous=True)
    tokens = [(s, kv.next_pos[s] - 1) for s in (0, 1, 2, 3)]
    mask, table = ubatch_inputs(kv, tokens, 16)
    q = rng.standard_normal((n_head, len(tokens), dk)).astype(np.float32)
    k = rng.standard_normal((n_head_kv, kv.n_kv, dk)).astype(np.float32)
    v = rng.standard_normal((n_head_kv, kv.n_kv, dv)).astype(np.float32)
    softcap = 20.0 if extras != "plain" else 0.0
    sinks = rng.standard_normal(n_head).astype(np.float32) if extras != "plain" else None
    kw = {"scale": 1.0 / np.sqrt(dk), "softcap": softcap, "sinks": sinks}
    paged = ggml_fa.flash_attn(q, k, v, mask, pages=table, page_size=16, n_threads=n_threads, **kw)
    unpaged = ggml_fa.flash_attn(q, k, v, mask, n_threads=n_threads, **kw)
    np.testing.assert_allclose(paged, ggml_fa.reference(q, k, v, mask, **kw), atol=4e-3, rtol=0)
    assert not np.array_equal(paged[0], unpaged[0])
    np.testing.assert_array_equal(paged[1:], unpaged[1:])


def test_the_page_table_is_packed_per_sequence():
    """ggml takes one list per tag (the per-sequence page table): the rows' headers name it and carry their own last
    entries."""
    cut = 3 << ggml_fa.GGML_FA_PAGE_CUT_SHIFT
    flag = ggml_fa.GGML_FA_PAGE_UNMASKED
    rows = np.zeros((4, 2 + 4), np.int64)
    rows[0, :5] = (3, 7, 0 | flag, 2 | flag, 5 | flag | cut)  # a prompt chunk's first row: its list ends at its cell
    rows[1, :6] = (4, 7, 0 | flag, 2 | flag, 5 | flag, 6 | flag | cut)  # its last row: the longest, the tag's list
    rows[2, :4] = (2, 9, 1, 3)  # another sequence's decode row
    rows[3, :2] = (0, 4)  # a row with no pages
    packed = ggml_fa.pack_page_table(rows)
    header = packed[:16].reshape(4, 4)
    assert [tuple(h[:2]) for h in header] == [(3, 7), (4, 7), (2, 9), (0, 4)]
    assert header[0, 2] == header[1, 2] == 16  # one list for the two rows of tag 7, right after the headers
    assert list(packed[16:20]) == list(rows[1, 2:6]) and header[2, 2] == 20 and list(packed[20:22]) == [1, 3]
    assert packed.size == 22  # the per-row table took 4 x 6
    assert header[0, 3] == 5 | flag | cut and header[1, 3] == 6 | flag | cut and header[3, 3] == 0
    for r in range(4):  # each row reads its own list back: the shared list up to its end, its own last entry
        n, _, off, last = header[r]
        assert [packed[off + j] if j + 1 < n else last for j in range(n)] == list(rows[r, 2:2 + n])


def test_rows_of_one_tag_must_share_their_list():
    rows = np.array([[2, 1, 0, 4, 0], [3, 1, 0, 5, 6]], np.int64)  # the first row's page 4 is not in the other's
    with pytest.raises(ValueError, match="no prefix"):
        ggml_fa.pack_page_table(rows)


@pytest.mark.parametrize("paged", [True, False])
@pytest.mark.parametrize("tokens_of", ["prefill", "decode"])
def test_cells_masked_for_every_row_are_never_read(paged, tokens_of):
    """Another sequence's cells (seq 7, an idle slot) hold NaN in K and V, as a half-written state staged beside the
    compute may (native/src/llama-state-staged.h): no query row may see them. The tiled path loaded every column of a
    tile that some row keeps and let the -inf mask cancel it, which NaN defeats; it now zeroes a column masked in every
    row of the tile. Paged and unpaged, the tiled prefill and the per-row decode paths."""
    rng = np.random.default_rng({"prefill": 31, "decode": 32}[tokens_of] + 2 * paged)
    kv = shared_prefix_layout(rng, 1000)
    for s in (0, 1, 2):
        kv.append(s, 1)
    if tokens_of == "prefill":
        tokens = [(1, p) for p in range(kv.next_pos[1] - 70, kv.next_pos[1])]
        tokens += [(2, p) for p in range(kv.next_pos[2] - 10, kv.next_pos[2])]
    else:
        tokens = [(s, kv.next_pos[s] - 1) for s in (0, 1, 2)]
    mask, table = ubatch_inputs(kv, tokens, 16)
    q, k, v = random_qkv(rng, len(tokens), kv.n_kv)
    ref = ggml_fa.reference(q, k, v, mask, scale=SCALE)
    idle = [c for c in range(kv.n_kv) if kv.owners[c] == {7}]
    assert len(idle) == 300
    k[:, idle], v[:, idle] = np.nan, np.nan
    out = ggml_fa.flash_attn(q, k, v, mask, scale=SCALE, pages=table if paged else None, page_size=16)
    assert not np.isnan(out).any()
    np.testing.assert_allclose(out, ref, atol=4e-3, rtol=0)
