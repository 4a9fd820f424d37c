#pragma once

// Paged attention (Arbor): a sequence's pages as the tokens of a ubatch read them, shared by the page table
// (llama-kv-pages.cpp) and the paged mask with its self-check (llama-kv-paged-mask.cpp).

#include "llama-batch.h"
#include "llama-kv-cells.h"

#include <algorithm>
#include <vector>

// paged attention: the lowest position of each sequence in the ubatch (a token counts as its first
// sequence id, as in the mask), INT32_MAX for a sequence without tokens there; out holds LLAMA_MAX_SEQ entries
inline void ubatch_seq_pos_min(const llama_ubatch * ubatch, llama_pos * out) {
    std::fill(out, out + LLAMA_MAX_SEQ, INT32_MAX);
    for (uint32_t i = 0; i < ubatch->n_tokens; ++i) {
        out[ubatch->seq_id[i][0]] = std::min(out[ubatch->seq_id[i][0]], ubatch->pos[i]);
    }
}

// paged attention: a sequence's pages as its tokens in a ubatch read them.
//
// `list` holds the sequence's ascending pages, each marked GGML_FA_PAGE_UNMASKED (with its cut) where
// llama_kv_cells::seq_page_mark marks it for pos_min, the sequence's lowest position in the ubatch: every token of the
// sequence keeps that page's cells up to the cut. The other pages need the mask, unless they end the list as a causal
// tail.
//
// Causality from positions: the unmarked pages at the end of the list that each hold the sequence's cells from their
// starts (seq_page_mark for any position), with those cells' positions never decreasing through them in list order (a
// prompt chunk written into pages of its own), form the causal tail. A token at position p keeps there exactly the
// tail's cells at positions <= p, which are its first ones, so its list ends at the page of its last such cell: every
// tail page before it marked and cut where the sequence's cells end, that page cut after the token's last cell. The
// sequence's tokens then read the mask only in the unmarked pages before the tail (none for a sequence in pages of its
// own), and their lists are prefixes of one list, differing only in the cut of their last page (the contract of
// ggml_flash_attn_ext_set_pages).
struct paged_seq_pages {
    std::vector<int32_t>   list;        // the pages, ascending, with pos_min's marks
    int32_t                tail = -1;   // the index in list of the causal tail's first page; -1: no causal tail
    std::vector<llama_pos> tail_pos;    // the positions of the tail's cells of the sequence, in list order
    std::vector<int32_t>   tail_cells;  // per tail page, the count of those cells in it and the tail pages before it

    // the page list of a token at position p (its pages, marked, ending at its own cell in a causal tail): writes it to
    // out, returns its count
    int32_t row(llama_pos p, uint32_t page_size, int32_t * out) const {
        if (tail < 0) {
            std::copy(list.begin(), list.end(), out);
            return (int32_t) list.size();
        }
        std::copy(list.begin(), list.begin() + tail, out);
        const int32_t e = (int32_t) (std::upper_bound(tail_pos.begin(), tail_pos.end(), p) - tail_pos.begin());
        int32_t n = tail;
        for (size_t k = 0; k < tail_cells.size() && e > (k == 0 ? 0 : tail_cells[k - 1]); ++k) {
            const int32_t before  = k == 0 ? 0 : tail_cells[k - 1];
            const int32_t visible = std::min(e, tail_cells[k]) - before;
            const int32_t page    = list[tail + k] & GGML_FA_PAGE_INDEX;
            out[n++] = page | GGML_FA_PAGE_UNMASKED | (((int32_t) page_size - visible) << GGML_FA_PAGE_CUT_SHIFT);
        }
        return n;
    }

    // the count of the entries row(p, ...) writes, and its last one in `last` (0 when there are none), without writing
    // them: a token's row is a prefix of the row of its sequence's highest position in the ubatch, but for its last entry
    int32_t row_last(llama_pos p, uint32_t page_size, int32_t & last) const {
        if (tail < 0) {
            last = list.empty() ? 0 : list.back();
            return (int32_t) list.size();
        }
        last = tail > 0 ? list[tail - 1] : 0;
        const int32_t e = (int32_t) (std::upper_bound(tail_pos.begin(), tail_pos.end(), p) - tail_pos.begin());
        int32_t n = tail;
        for (size_t k = 0; k < tail_cells.size() && e > (k == 0 ? 0 : tail_cells[k - 1]); ++k) {
            const int32_t before  = k == 0 ? 0 : tail_cells[k - 1];
            const int32_t visible = std::min(e, tail_cells[k]) - before;
            const int32_t page    = list[tail + k] & GGML_FA_PAGE_INDEX;
            last = page | GGML_FA_PAGE_UNMASKED | (((int32_t) page_size - visible) << GGML_FA_PAGE_CUT_SHIFT);
            n++;
        }
        return n;
    }
};

// the pages of seq_id (at most n_pages_max), marked and with its causal tail when `mark` (the paged mask applies)
paged_seq_pages paged_seq_pages_get(const llama_kv_cells & cells, llama_seq_id seq_id, llama_pos pos_min,
        uint32_t n_pages_max, bool mark);
