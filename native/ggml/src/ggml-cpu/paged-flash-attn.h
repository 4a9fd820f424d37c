#pragma once

// Paged flash attention on the CPU (Arbor): the page table of ggml_flash_attn_ext_set_pages as a row reads it, the
// GQA-packed per-row path and its per-batch plan. ops.cpp's flash-attention kernel (the topic "ggml-cpu: paged flash
// attention") includes this header and calls these when an op carries a page table; its per-row, split-KV and tiled
// paths read pages through fa_row themselves.

#include "ggml.h"
#include "ggml-cpu-impl.h"

#include <cmath>
#include <cstdint>
#include <vector>

// paged attention: a query row's page list (ggml_flash_attn_ext_set_pages: its sequence's list, but for
// the row's own last entry), page j of it with its flags stripped, the end of the row's part of it (a page cut short,
// GGML_FA_PAGE_CUT, ends before the page does), and whether the row may skip the mask there (GGML_FA_PAGE_UNMASKED:
// the mask is 0 at every cell of the row's part of the page)
struct fa_row {
    const int32_t * list = nullptr; // its sequence's list; nullptr: no row
    int32_t n    = 0;
    int32_t tag  = 0;
    int32_t last = 0;

    int32_t at(int64_t j) const { return j + 1 < n ? list[j] : last; }
    explicit operator bool() const { return list != nullptr; }
};

static inline fa_row fa_row_of(const ggml_tensor * pages, int64_t r) {
    const int32_t * t = (const int32_t *) pages->data;
    const int32_t * h = t + GGML_FA_ROW_INTS*r;
    fa_row row;
    row.list = t + h[2];
    row.n    = h[0];
    row.tag  = h[1];
    row.last = h[3];
    return row;
}

static inline int64_t fa_page(const fa_row & row, int64_t j) {
    return row.at(j) & GGML_FA_PAGE_INDEX;
}

static inline int64_t fa_page_end(const fa_row & row, int64_t j, int64_t page_size) {
    return (fa_page(row, j) + 1)*page_size - GGML_FA_PAGE_CUT(row.at(j));
}

static inline bool fa_page_unmasked(const fa_row & row, int64_t j) {
    return (row.at(j) & GGML_FA_PAGE_UNMASKED) != 0;
}

// paged attention: what a KV tile's cells are to the rows of a page-table row (the tile's rows share one):
// each cell outside the row's pages or past a page's cut (FA_CELL_OUT: -inf whatever the mask holds), in a page whose mask is read
// (FA_CELL_MASKED) or in a page marked GGML_FA_PAGE_UNMASKED (FA_CELL_FREE: 0, the mask is not read, it may be unwritten).
// Fills state[0, n) for cells [c0, c0 + n) from page list index j and returns the kind all cells share, or FA_CELL_MIXED.
enum fa_cell_kind { FA_CELL_OUT, FA_CELL_MASKED, FA_CELL_FREE, FA_CELL_MIXED };

static inline fa_cell_kind fa_tile_cells(const fa_row & prow, int32_t j, int64_t c0, int n, int64_t page_size, uint8_t * state) {
    int counts[3] = { 0, 0, 0 };
    for (int t = 0; t < n; t++) {
        const int64_t c = c0 + t;
        while (j < prow.n && fa_page_end(prow, j, page_size) <= c) {
            j++;
        }
        const bool in_page = j < prow.n && fa_page(prow, j)*page_size <= c;
        state[t] = !in_page ? FA_CELL_OUT : fa_page_unmasked(prow, j) ? FA_CELL_FREE : FA_CELL_MASKED;
        counts[state[t]]++;
    }
    for (int k = 0; k < 3; k++) {
        if (counts[k] == n) {
            return (fa_cell_kind) k;
        }
    }
    return FA_CELL_MIXED;
}

// merge one chunk's partial online softmax (M, S, VKQ[DV]) into a running one (M, S, acc); an empty chunk (S == 0) adds
// nothing (shared by the split-KV reduction and the planned per-row path's)
static inline void ggml_fa_merge_partial(float & M, float & S, float * acc, const float * partial, int64_t DV) {
    const float M_chunk = partial[0];
    const float S_chunk = partial[1];
    if (S_chunk == 0.0f) {
        return;
    }
    const float M_new     = fmaxf(M, M_chunk);
    const float scale_old = expf(M - M_new);
    const float scale_new = expf(M_chunk - M_new);
    for (int64_t d = 0; d < DV; ++d) {
        acc[d] = acc[d] * scale_old + partial[2 + d] * scale_new;
    }
    S = S * scale_old + S_chunk * scale_new;
    M = M_new;
}

// the heads of one pass for a GQA ratio: the whole group up to GGML_FA_GQA_PACK_MAX, else its largest divisor that fits
int64_t ggml_fa_pass_heads(int64_t rk2);

// the paged per-row path over items [ir0, ir1) (rows with heads fastest), the heads of a KV group in one pass over the
// cells of pages [pg_start, pg_end) of each row's list, clipped to cells [ic_start, ic_end); with partials, each head
// writes its (M, S, VKQ) there instead of its output row (paged-flash-attn.cpp says what the caller guarantees)
void ggml_compute_forward_flash_attn_ext_f16_gqa_packed(
        ggml_tensor * dst,
        int ir0, int ir1,
        int64_t ic_start, int64_t ic_end,
        float * partials, int64_t partial_stride,
        int64_t pg_start, int64_t pg_end);

// whether the paged per-row path takes the heads of a KV group in passes: every GQA ratio, MHA's 1 and MLA's single KV
// head included
bool ggml_fa_gqa_packs(const ggml_tensor * dst);

struct ggml_fa_plan_item {
    int32_t row;      // query row
    int32_t group;    // pass: query heads [group*P, (group + 1)*P), P = ggml_fa_pass_heads(rk2); -1: all the row's passes
    int32_t pg0, pg1; // range of the row's page list
    int32_t slot;     // partials slot of a piece of a cut pass; -1: a whole pass, written to dst
};

struct ggml_fa_plan_cut {
    int32_t row, group;
    int32_t slot0, n; // the pass's pieces: slots [slot0, slot0 + n)
};

// the plan for a paged, GQA-packed per-row op on nth threads with a work buffer of cap_floats floats; false for one
// thread or one row, or when the partials of the cut passes would not fit: then the usual chunks run
bool ggml_fa_plan(const ggml_tensor * dst, int nth, size_t cap_floats,
        std::vector<ggml_fa_plan_item> & items, std::vector<ggml_fa_plan_cut> & cuts);

// runs a plan (every thread, after the threadpool's chunk counter was set to nth and a barrier passed)
void ggml_compute_forward_flash_attn_ext_planned(
        const ggml_compute_params * params,
        ggml_tensor * dst,
        const std::vector<ggml_fa_plan_item> & items,
        const std::vector<ggml_fa_plan_cut> & cuts);
