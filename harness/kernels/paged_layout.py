"""A model of a unified KV's cells for checking paged flash attention against masked attention: who owns
each cell and at which position, and from that the mask, the per-token page table and llama.cpp's
marks an ubatch gets (GGML_FA_PAGE_UNMASKED, and a cut for a page the sequence fills from its start), with each
token's list ending at its own cell in a causal tail.

It is an oracle written apart from the C code (llama_kv_cells and native/src/llama-kv-pages.{h,cpp}: pages per
sequence, owned pages, unmarked pages, exact lengths, causal tails): the operator
tests (tests/server/engine/test_paged_attention_op.py) and the kernel check on an accelerator
(paged_kernel_check.py) build their inputs with it.
"""

from __future__ import annotations

import numpy as np

from harness.kernels.ggml_fa import GGML_FA_PAGE_CUT_SHIFT, GGML_FA_PAGE_UNMASKED


class UnifiedKV:
    """Cells of one unified KV: who owns each cell and at which position."""

    def __init__(self, n_kv: int, rng: np.random.Generator):
        self.n_kv = n_kv
        self.rng = rng
        self.free = list(rng.permutation(n_kv))  # scattered placement, as after evictions
        self.owners: list[set[int]] = [set() for _ in range(n_kv)]
        self.pos = np.full(n_kv, -1)
        self.next_pos: dict[int, int] = {}

    def reserve(self, start: int, n: int) -> None:
        """Keep cells [start, start + n) out of every later placement but `append(..., at=...)`'s."""
        taken = set(range(start, start + n))
        self.free = [c for c in self.free if c not in taken]

    def append(self, seq: int, n: int, *, contiguous: bool = False, at: int | None = None) -> list[int]:
        """n cells for seq at its next positions: the next free ones (scattered, or the lowest with `contiguous`), or
        [at, at + n), which must hold no cell (a reserved run: pages of the sequence's own)."""
        if at is not None:
            cells = list(range(at, at + n))
            assert all(not self.owners[c] for c in cells), "append(at=...) over used cells"
            self.free = [c for c in self.free if c not in set(cells)]
        else:
            if contiguous:
                self.free.sort()
            cells = [int(self.free.pop(0)) for _ in range(n)]
        for c in cells:
            self.owners[c].add(seq)
            self.pos[c] = self.next_pos.get(seq, 0)
            self.next_pos[seq] = self.pos[c] + 1
        return cells

    def share(self, src: int, dst: int) -> None:
        """seq_cp: dst attends to every cell of src, no copy."""
        for c in range(self.n_kv):
            if src in self.owners[c]:
                self.owners[c].add(dst)
        self.next_pos[dst] = self.next_pos[src]

    def mask_row(self, seq: int, pos: int) -> np.ndarray:
        row = np.full(self.n_kv, -np.inf)
        for c in range(self.n_kv):
            if seq in self.owners[c] and self.pos[c] <= pos:
                row[c] = 0.0
        return row

    def pages(self, seq: int, page_size: int) -> list[int]:
        return sorted({c // page_size for c in range(self.n_kv) if seq in self.owners[c]})


def ubatch_inputs(kv: UnifiedKV, tokens: list[tuple[int, int]], page_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The mask and the per-token page table for tokens [(seq, pos)], as llama.cpp fills them."""
    mask = np.stack([kv.mask_row(s, p) for s, p in tokens])
    n_pages_max = -(-kv.n_kv // page_size)
    table = np.zeros((len(tokens), 2 + n_pages_max), dtype=np.int32)
    for i, (s, _) in enumerate(tokens):
        pg = kv.pages(s, page_size)
        table[i, 0] = len(pg)
        table[i, 1] = s  # the tag: rows with one tag have one page list
        table[i, 2:2 + len(pg)] = pg
    return mask, table


def page_mark(kv: UnifiedKV, seq: int, page: int, page_size: int, pos_min: int) -> int | None:
    """llama.cpp's mark of a page for the tokens of `seq` at positions >= pos_min (llama_kv_cells::seq_page_mark):
    None, or the cut c when the page's first page_size - c cells all belong to seq at positions <= pos_min and no
    later cell of the page does (0: the whole page)."""
    start = page * page_size
    cells = [c for c in range(start, min(start + page_size, kv.n_kv)) if seq in kv.owners[c]]
    if not cells or cells != list(range(start, start + len(cells))) or any(kv.pos[c] > pos_min for c in cells):
        return None
    return page_size - len(cells)


def causal_tail(kv: UnifiedKV, seq: int, pages: list[int], marks: list[int | None], page_size: int) -> int:
    """The index in `pages` of the causal tail's first page, len(pages) when there is none: the unmarked pages that end
    the list, each holding seq's cells from its start, with their positions not decreasing through them in list
    order (a causal tail)."""
    tail, later = len(pages), None
    for j in range(len(pages) - 1, -1, -1):
        start = pages[j] * page_size
        cells = [c for c in range(start, min(start + page_size, kv.n_kv)) if seq in kv.owners[c]]
        positions = [int(kv.pos[c]) for c in cells]
        if (marks[j] is not None or cells != list(range(start, start + len(cells))) or positions != sorted(positions)
                or (later is not None and positions[-1] > later)):
            break
        tail, later = j, positions[0]
    return tail


def mark_unmasked(kv: UnifiedKV, tokens: list[tuple[int, int]], table: np.ndarray, page_size: int) -> np.ndarray:
    """The table with llama.cpp's marks: GGML_FA_PAGE_UNMASKED and the cut of `page_mark`, for each sequence's
    lowest position in the ubatch; in a causal tail each token's list ends at the page of its last cell there, every
    tail page marked and cut after the token's cells in it."""
    pos_min: dict[int, int] = {}
    for s, p in tokens:
        pos_min[s] = min(pos_min.get(s, p), p)
    marked = table.copy()
    for i, (s, p) in enumerate(tokens):
        pages = [int(x) for x in table[i, 2:2 + table[i, 0]]]
        marks = [page_mark(kv, s, page, page_size, pos_min[s]) for page in pages]
        tail = causal_tail(kv, s, pages, marks, page_size)
        entries = [page | (GGML_FA_PAGE_UNMASKED | (cut << GGML_FA_PAGE_CUT_SHIFT) if cut is not None else 0)
                   for page, cut in zip(pages[:tail], marks[:tail])]
        for page in pages[tail:]:
            start = page * page_size
            seen = sum(1 for c in range(start, min(start + page_size, kv.n_kv))
                       if s in kv.owners[c] and kv.pos[c] <= p)
            if seen == 0:
                break
            entries.append(page | GGML_FA_PAGE_UNMASKED | ((page_size - seen) << GGML_FA_PAGE_CUT_SHIFT))
        marked[i, 0] = len(entries)
        marked[i, 2:] = 0
        marked[i, 2:2 + len(entries)] = entries
    return marked
