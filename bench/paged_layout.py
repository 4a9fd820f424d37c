"""A model of a unified KV's cells for checking paged flash attention against masked attention: who owns
each cell and at which position, and from that the mask, the per-token page table and llama.cpp's
marks an ubatch gets (GGML_FA_PAGE_UNMASKED, and a cut for a page the sequence fills from its start).

It is an oracle written apart from the C code (llama_kv_cells, patches 0003, 0008, 0014 and 0022): the operator
tests (tests/server/engine/test_paged_attention_op.py) and the kernel check on an accelerator
(bench/paged_kernel_check.py) build their inputs with it.
"""

from __future__ import annotations

import numpy as np

from bench.ggml_fa import GGML_FA_PAGE_CUT_SHIFT, GGML_FA_PAGE_UNMASKED


class UnifiedKV:
    """Cells of one unified KV: who owns each cell and at which position."""

    def __init__(self, n_kv: int, rng: np.random.Generator):
        self.n_kv = n_kv
        self.rng = rng
        self.free = list(rng.permutation(n_kv))  # scattered placement, as after evictions
        self.owners: list[set[int]] = [set() for _ in range(n_kv)]
        self.pos = np.full(n_kv, -1)
        self.next_pos: dict[int, int] = {}

    def append(self, seq: int, n: int, *, contiguous: bool = False) -> list[int]:
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


def mark_unmasked(kv: UnifiedKV, tokens: list[tuple[int, int]], table: np.ndarray, page_size: int) -> np.ndarray:
    """The table with llama.cpp's marks: GGML_FA_PAGE_UNMASKED and the cut of `page_mark`, for each sequence's
    lowest position in the ubatch."""
    pos_min: dict[int, int] = {}
    for s, p in tokens:
        pos_min[s] = min(pos_min.get(s, p), p)
    marked = table.copy()
    for i, (s, _) in enumerate(tokens):
        for j in range(table[i, 0]):
            cut = page_mark(kv, s, int(table[i, 2 + j]), page_size, pos_min[s])
            if cut is not None:
                marked[i, 2 + j] |= GGML_FA_PAGE_UNMASKED | (cut << GGML_FA_PAGE_CUT_SHIFT)
    return marked
