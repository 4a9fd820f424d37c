"""Pages owned by one sequence (native/src/llama-kv-pages.cpp, issue 33 item 2), on the real engine (embedded model).

With paged attention on, llama.cpp's find_slot places a sequence's tokens in a page of its own:
the page it is filling, else a free page, else (a cache full of partly used pages) any free
cell. So sequences decoding side by side no longer share the pages of their decode tokens, and
a sequence of n cells alone walks ceil(n / page_size) pages; a page is shared only through
seq_cp (a shared prefix). Stock placement gave the decode tokens of 8 sequences consecutive
cells, so every sequence walked every decode page.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.server.engine import test_paged_attention_real
from tests.server.engine.kv_probe import next_logits

pytestmark = pytest.mark.model
PAGE = 16


def runtime(paged: str, **kw):
    """The embedded model's runtime; paged, with llama.cpp's self-check of every paged mask on
    (native/src/llama-kv-paged-mask.cpp)."""
    from server.engine import paged_attention

    kw.setdefault("page_placement", "owned")
    rt = test_paged_attention_real.runtime(paged, **kw)
    if rt.paged_attn.enabled:
        paged_attention.set_self_check(rt.ctx, True)
    return rt


def close(rt) -> None:
    """Close rt after checking that no paged mask it built failed the self-check."""
    from server.engine import paged_attention

    try:
        if rt.paged_attn.enabled:
            assert paged_attention.self_check_failures(rt.ctx) == 0, "a paged mask failed llama.cpp's self-check"
    finally:
        rt.close()


def prompt_tokens(rt, n: int, salt: int = 0) -> list[int]:
    text = " ".join(f"item{salt}-{i}" for i in range(n))
    return rt.tokenize(text, add_special=False, parse_special=False)[:n]


def prefill(rt, seq: int, tokens: list[int], start: int = 0) -> None:
    from server.engine.llama_runtime import BatchEntry

    rt.decode([BatchEntry(t, start + i, seq, i == len(tokens) - 1) for i, t in enumerate(tokens)])


def decode_together(rt, seqs: list[int], steps: int, start: dict[int, int]) -> None:
    from server.engine.llama_runtime import BatchEntry

    for step in range(steps):
        rt.decode([BatchEntry(300 + step, start[s] + step, s, True) for s in seqs])


def test_sequences_decoding_together_each_fill_pages_of_their_own():
    rt = runtime("on", n_ctx=2048, n_seq_max=8)
    try:
        for s in range(8):
            prefill(rt, s, prompt_tokens(rt, 20, s))
        decode_together(rt, list(range(8)), 40, dict.fromkeys(range(8), 20))
        pages = [rt.seq_pages(s) for s in range(8)]
        for s in range(8):
            assert len(pages[s]) == math.ceil(60 / PAGE), (s, pages[s])
        assert len(set().union(*map(set, pages))) == sum(map(len, pages)), "two sequences share a page"
    finally:
        close(rt)


def test_prompts_of_several_sequences_in_one_batch_get_separate_pages():
    from server.engine.llama_runtime import BatchEntry

    rt = runtime("on", n_ctx=2048, n_seq_max=4)
    try:
        batch = [BatchEntry(t, i, s, i == 19) for s in range(4) for i, t in enumerate(prompt_tokens(rt, 20, s))]
        # interleaved token by token: stock placement would give each page tokens of all four
        batch.sort(key=lambda e: (e.pos, e.seq_id))
        rt.decode(batch)
        pages = [rt.seq_pages(s) for s in range(4)]
        assert all(len(p) == 2 for p in pages), pages
        assert len(set().union(*map(set, pages))) == 8
    finally:
        close(rt)


def test_a_shared_prefix_shares_its_pages_and_each_branch_continues_in_its_own():
    rt = runtime("on", n_ctx=2048, n_seq_max=2)
    try:
        prefill(rt, 0, prompt_tokens(rt, 40))
        rt.seq_cp(0, 1)
        shared = rt.seq_pages(0)
        assert shared == rt.seq_pages(1) and len(shared) == 3
        decode_together(rt, [0, 1], 10, {0: 40, 1: 40})
        a, b = rt.seq_pages(0), rt.seq_pages(1)
        # the prefix's last page is partly used and shared: neither branch writes into it
        assert set(a) & set(b) == set(shared)
        assert len(a) == len(b) == 4
    finally:
        close(rt)


def test_cells_freed_in_a_sequences_own_page_are_filled_again():
    rt = runtime("on", n_ctx=2048, n_seq_max=2)
    try:
        prefill(rt, 0, prompt_tokens(rt, 40))
        prefill(rt, 1, prompt_tokens(rt, 40, 1))
        before = rt.seq_pages(0)
        assert rt.seq_rm(0, 30, -1)
        prefill(rt, 0, prompt_tokens(rt, 10, 2), start=30)
        assert rt.seq_pages(0) == before
    finally:
        close(rt)


def test_a_sequence_goes_on_after_its_last_cell_even_when_free_pages_lie_below():
    """Its cells ascend with its positions, as llama.cpp's placement mostly leaves them: the kernel sums cells in
    cell order, and F16 accumulation makes logits depend slightly on that order."""
    rt = runtime("on", n_ctx=2048, n_seq_max=2)
    try:
        prefill(rt, 0, prompt_tokens(rt, 64))      # pages 0-3
        prefill(rt, 1, prompt_tokens(rt, 40, 1))   # pages 4-6, the last one partly used
        assert rt.seq_rm(0)                        # pages 0-3 free; llama.cpp's search head goes back to cell 0
        prefill(rt, 1, prompt_tokens(rt, 30, 2), start=40)
        assert rt.seq_pages(1) == [4, 5, 6, 7, 8]
    finally:
        close(rt)


def test_a_cache_of_partly_used_pages_still_takes_every_free_cell_and_stays_exact():
    """No free page is left, so a new sequence's prompt goes into other sequences' pages: what stock
    placement would fit, this fits too, and the logits are those of unpaged attention over the same
    operations (top-1 of every prompt row)."""
    tops = {}
    for mode in ("on", "off"):
        rt = runtime(mode, n_ctx=256, n_seq_max=9, n_batch=256)
        try:
            assert rt.n_ctx == 256
            for s in range(8):
                prefill(rt, s, prompt_tokens(rt, 17, s))  # 8 x (a full page + one cell): every page in use
            if mode == "on":
                assert all(len(rt.seq_pages(s)) == 2 for s in range(8))
            from server.engine.llama_runtime import BatchEntry

            tokens = prompt_tokens(rt, 100, 9)
            idx = rt.decode([BatchEntry(t, i, 8, True) for i, t in enumerate(tokens)])
            tops[mode] = np.argmax(rt.logits_matrix(len(idx)), axis=1).copy()
            if mode == "on":
                others = set().union(*(rt.seq_pages(s) for s in range(8)))
                assert set(rt.seq_pages(8)) <= others  # no free page was left: it shares the others' pages
        finally:
            close(rt)
    agreement = float(np.mean(tops["on"] == tops["off"]))
    assert agreement >= 0.97, agreement


def test_seq_pages_is_none_when_paging_is_off():
    rt = runtime("off", n_ctx=512, n_seq_max=1)
    try:
        prefill(rt, 0, prompt_tokens(rt, 8))
        assert rt.seq_pages(0) is None
    finally:
        close(rt)


def test_llama_cpp_placement_puts_the_decode_tokens_of_all_sequences_in_every_page():
    """What owned pages replace (`page_placement="shared"`, llama.cpp's next free cells): the same script as
    test_sequences_decoding_together_each_fill_pages_of_their_own, and every sequence walks every decode page."""
    rt = runtime("on", n_ctx=2048, n_seq_max=8, page_placement="shared")
    try:
        for s in range(8):
            prefill(rt, s, prompt_tokens(rt, 20, s))
        decode_together(rt, list(range(8)), 40, dict.fromkeys(range(8), 20))
        pages = [set(rt.seq_pages(s)) for s in range(8)]
        decode_pages = set.intersection(*pages)
        assert len(decode_pages) >= 8 * 40 // PAGE
        assert all(len(p) > math.ceil(60 / PAGE) + 15 for p in pages)
    finally:
        close(rt)


def test_defragmentation_moves_a_full_caches_strays_into_pages_of_their_own():
    """A full cache put a prompt among the other sequences' cells; once cells are freed, llama_paged_attn_defrag moves
    the cells that are a minority in such a page (K, V and bookkeeping) into pages of their own sequence: no page is
    mixed any more, the self-check of the next masks passes (close), and a moved sequence's next decode gives the
    logits it gave before the move, up to the cell order's own spread (test_paged_attention_logits.LAYOUT_BOUND)."""
    from tests.server.engine.test_paged_attention_logits import LAYOUT_BOUND

    rt = runtime("on", n_ctx=256, n_seq_max=9, n_batch=256)
    try:
        for s in range(8):
            prefill(rt, s, prompt_tokens(rt, 17, s))  # 8 x (a full page + one cell): every page in use
        prefill(rt, 8, prompt_tokens(rt, 40, 9))      # no free page: its cells fill the others' second pages
        theirs = set(rt.seq_pages(8))
        holders = [s for s in range(8) if set(rt.seq_pages(s)) & theirs]
        assert len(holders) == 3                      # 15 + 15 + 10 free cells: one cell of each holder is a minority
        assert rt.defragment_pages() == 0             # no free page yet: nothing can move

        before = {s: next_logits(rt, s, 17, 300) for s in holders}
        for s in [s for s in range(8) if s not in holders][:4]:
            assert rt.seq_rm(s)                       # frees 8 pages
        assert rt.defragment_pages() == len(holders) == rt.n_cells_defragmented
        live = holders + [8] + [s for s in range(8) if s not in holders][4:]
        pages = {s: set(rt.seq_pages(s)) for s in live}
        for a in live:
            for b in live:
                assert a == b or not pages[a] & pages[b], (a, b, pages)  # no page holds two sequences' cells
        assert len(pages[8]) == math.ceil(40 / PAGE) and all(len(pages[s]) == 2 for s in holders)
        assert rt.defragment_pages() == 0
        for s in holders:
            after = next_logits(rt, s, 17, 300)
            assert np.argmax(after) == np.argmax(before[s])
            assert float(np.abs(after - before[s]).max()) <= LAYOUT_BOUND, (s, float(np.abs(after - before[s]).max()))
    finally:
        close(rt)


def test_defragmentation_does_nothing_with_llama_cpp_placement_or_paging_off():
    from server.engine import paged_attention

    for kw in ({"paged": "on", "page_placement": "shared"}, {"paged": "off"}):
        rt = runtime(kw.pop("paged"), n_ctx=256, n_seq_max=2, **kw)
        try:
            prefill(rt, 0, prompt_tokens(rt, 20))
            assert paged_attention.defragment(rt.ctx) == 0
        finally:
            close(rt)
