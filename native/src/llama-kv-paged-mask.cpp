// Paged attention's mask (Arbor): written over each token's pages only, with its self-check against llama.cpp's own
// mask and a one-shot test fault. llama_kv_cache::set_input_kq_mask_paged is declared in llama-kv-cache.h and called
// by set_input_kq_mask (the topic "llama: the KV cache in pages"), which hands it llama.cpp's own mask for the check.

#include "llama-kv-cache.h"
#include "llama-kv-pages.h"
#include "llama-impl.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

// what the paged mask's helpers read of a ubatch (llama.cpp's own mask takes args_set_input_kq_mask, local to its file)
struct paged_mask_args {
    const llama_ubatch * ubatch;
    const std::vector<llama_kv_cells> & v_cells;
    int64_t n_kv;
};

// paged attention: the cells of sequence seq_id's pages whose mask set_input_kq_mask_paged writes, as
// ascending [begin, end) ranges with consecutive pages merged: every page when mask_outside_pages, else the pages
// that paged_seq_pages does not mark before its causal tail; the others are left unwritten. The mask fault of
// llama_paged_attn_inject_mask_fault walks the same ranges.
static std::vector<std::pair<int64_t, int64_t>> paged_mask_written_runs(const llama_kv_cells & cells,
        llama_seq_id seq_id, llama_pos pos_min, int64_t n_kv, bool mask_outside_pages) {
    const uint32_t page_size   = cells.get_page_size();
    const uint32_t n_pages_max = (n_kv + page_size - 1)/page_size;

    const paged_seq_pages sp = paged_seq_pages_get(cells, seq_id, pos_min, n_pages_max, !mask_outside_pages);

    std::vector<std::pair<int64_t, int64_t>> runs;
    for (size_t j = 0; j < (sp.tail >= 0 ? (size_t) sp.tail : sp.list.size()); ++j) {
        const int32_t entry = sp.list[j]; // (a causal tail's pages are marked in each token's list)
        if (entry & GGML_FA_PAGE_UNMASKED) {
            continue; // every token of the sequence keeps the page's cells up to its cut, and the CPU kernel reads no mask there
        }
        const int64_t j0 = (int64_t) (entry & GGML_FA_PAGE_INDEX)*page_size;
        const int64_t j1 = std::min<int64_t>(j0 + page_size, n_kv);
        if (!runs.empty() && runs.back().second == j0) {
            runs.back().second = j1;
        } else {
            runs.emplace_back(j0, j1);
        }
    }
    return runs;
}

// paged attention: the mask of a causal, non-SWA, non-ALiBi, 1D-position ubatch over one stream,
// visiting only the pages of each token's sequence: inside them the same rule as set_input_kq_mask_impl (a cell is
// kept when it belongs to the token's sequence at a position <= the token's); outside them -INF when
// mask_outside_pages (a backend that ignores the page table may run the attention), else left as it was (only the
// CPU kernel reads this mask, and never there). Likewise, with mask_outside_pages false, a page the table marks
// GGML_FA_PAGE_UNMASKED (llama_kv_cells::seq_page_mark for the sequence's lowest position in the ubatch: the mask
// is 0 there for each of its tokens, up to the page's cut and -INF after it) is left unwritten. poison_unwritten (the self-check, CPU only) writes NaN there
// instead, so that a kernel reading an entry it must not read turns the logits to NaN.
// Rows after the first of a sequence copy its pages and update only the cells near the ubatch's positions.
template<typename T>
static void fill_paged_mask(const paged_mask_args & args, T * data, bool mask_outside_pages,
        bool poison_unwritten) {
    const auto & ubatch = args.ubatch;
    const auto & cells  = args.v_cells[0];

    const int64_t n_kv = args.n_kv;

    const T mask_keep = llama_cast<T>(0.0f);
    const T mask_drop = llama_cast<T>(-INFINITY);

    struct seq_rows {
        int64_t               first = -1;
        std::vector<std::pair<int64_t, int64_t>> runs; // paged_mask_written_runs
        std::vector<uint32_t> idxs; // cells of the sequence at positions near the ubatch's
    };
    std::unordered_map<llama_seq_id, seq_rows> seqs;

    llama_pos pos_min[LLAMA_MAX_SEQ];
    ubatch_seq_pos_min(ubatch, pos_min);

    for (uint32_t i = 0; i < ubatch->n_tokens; ++i) {
        const llama_seq_id seq_id = ubatch->seq_id[i][0];
        const llama_pos    p1     = ubatch->pos[i];

        T * row = data + n_kv*i;
        if (mask_outside_pages) {
            std::fill(row, row + n_kv, mask_drop);
        } else if (poison_unwritten) {
            std::fill(row, row + n_kv, llama_cast<T>(NAN));
        }

        auto & sr = seqs[seq_id];
        if (sr.first < 0) {
            sr.first = i;
            sr.runs  = paged_mask_written_runs(cells, seq_id, pos_min[seq_id], n_kv, mask_outside_pages);
            for (const auto & [j0, j1] : sr.runs) {
                for (int64_t j = j0; j < j1; ++j) {
                    if (cells.is_empty(j) || !cells.seq_has(j, seq_id)) {
                        row[j] = mask_drop; // another sequence's cell in a shared page
                        continue;
                    }
                    const llama_pos p0 = cells.pos_get(j);
                    if (p0 + 32 >= pos_min[seq_id]) {
                        sr.idxs.push_back(j);
                    }
                    row[j] = p0 <= p1 ? mask_keep : mask_drop;
                }
            }
            continue;
        }

        const T * src = data + n_kv*sr.first;
        for (const auto & [j0, j1] : sr.runs) {
            std::copy(src + j0, src + j1, row + j0);
        }
        for (const uint32_t j : sr.idxs) {
            row[j] = cells.pos_get(j) <= p1 ? mask_keep : mask_drop;
        }
    }
}

// paged attention: the self-check (llama_set_paged_attn_self_check). For each sequence of the ubatch the
// page list kept by the cells' bookkeeping must equal the pages found by scanning the cells, and every cell the
// sequence's tokens may attend to (llama.cpp's own mask keeps it) must lie in those pages; inside them the paged mask
// must equal llama.cpp's own mask, except in a page marked GGML_FA_PAGE_UNMASKED for the sequence (the paged mask is
// unwritten there unless mask_outside_pages), where llama.cpp's mask must keep every cell before the page's cut for
// every token; the cells after a cut count as outside the pages.
// Returns false (and logs the first difference) when one of these does not hold.
template<typename T>
static bool paged_mask_self_check(const paged_mask_args & args, const T * paged, bool mask_outside_pages,
        const std::function<void(void *)> & llama_mask) {
    const auto & ubatch = args.ubatch;
    const auto & cells  = args.v_cells[0];

    const int64_t  n_kv        = args.n_kv;
    const uint32_t page_size   = cells.get_page_size();
    const uint32_t n_pages_max = (n_kv + page_size - 1)/page_size;

    std::vector<T> stock((size_t) n_kv*ubatch->n_tokens);
    llama_mask(stock.data());

    llama_pos pos_min[LLAMA_MAX_SEQ];
    ubatch_seq_pos_min(ubatch, pos_min);

    std::unordered_map<llama_seq_id, paged_seq_pages> lists;
    std::vector<int32_t> entries(n_pages_max);
    for (uint32_t i = 0; i < ubatch->n_tokens; ++i) {
        const llama_seq_id seq_id = ubatch->seq_id[i][0];

        auto it = lists.find(seq_id);
        if (it == lists.end()) {
            std::vector<int32_t> kept(n_pages_max);
            kept.resize(cells.seq_pages_get(seq_id, kept.data(), n_pages_max));

            std::vector<int32_t> scanned;
            for (uint32_t p = 0; p < n_pages_max; ++p) {
                const uint32_t j1 = std::min<uint32_t>((p + 1)*page_size, cells.size());
                for (uint32_t j = p*page_size; j < j1; ++j) {
                    if (!cells.is_empty(j) && cells.seq_has(j, seq_id)) {
                        scanned.push_back((int32_t) p);
                        break;
                    }
                }
            }
            if (kept != scanned) {
                LLAMA_LOG_ERROR("%s: sequence %d: %zu pages kept, %zu found by scanning the cells\n", __func__, seq_id,
                        kept.size(), scanned.size());
                return false;
            }
            it = lists.emplace(seq_id, paged_seq_pages_get(cells, seq_id, pos_min[seq_id], n_pages_max, true)).first;
        }

        // the cells of the token's pages as the kernel sees them (its row of the page table): a marked page up to its
        // cut, unmasked; with a causal tail, only the pages up to the one of its last cell
        std::vector<bool> in_pages(n_kv, false);
        std::vector<bool> unmasked(n_kv, false);
        const int32_t n_entries = it->second.row(ubatch->pos[i], page_size, entries.data());
        for (int32_t k = 0; k < n_entries; ++k) {
            const int64_t p   = entries[k] & GGML_FA_PAGE_INDEX;
            const bool    um  = (entries[k] & GGML_FA_PAGE_UNMASKED) != 0;
            const int64_t j1  = std::min<int64_t>((p + 1)*page_size - (um ? GGML_FA_PAGE_CUT(entries[k]) : 0), n_kv);
            for (int64_t j = p*page_size; j < j1; ++j) {
                in_pages[j] = true;
                unmasked[j] = um;
            }
        }

        const T * row_paged = paged + (size_t) n_kv*i;
        const T * row_stock = stock.data() + (size_t) n_kv*i;
        for (int64_t j = 0; j < n_kv; ++j) {
            const float want = llama_cast<float>(row_stock[j]);
            if (!in_pages[j]) {
                if (want != -INFINITY) {
                    LLAMA_LOG_ERROR("%s: token %u (sequence %d, pos %d) may attend to cell %lld, outside its pages\n",
                            __func__, i, seq_id, ubatch->pos[i], (long long) j);
                    return false;
                }
                continue;
            }
            if (unmasked[j]) {
                if (want != 0.0f) {
                    LLAMA_LOG_ERROR("%s: token %u (sequence %d, pos %d): cell %lld is in a page marked unmasked, "
                            "llama.cpp's mask holds %f there\n", __func__, i, seq_id, ubatch->pos[i], (long long) j, want);
                    return false;
                }
                if (!mask_outside_pages) {
                    continue; // left unwritten
                }
            }
            const float have = llama_cast<float>(row_paged[j]);
            if (have != want) {
                LLAMA_LOG_ERROR("%s: token %u (sequence %d, pos %d), cell %lld: paged mask %f, llama.cpp's %f\n",
                        __func__, i, seq_id, ubatch->pos[i], (long long) j, have, want);
                return false;
            }
        }
    }
    return true;
}

// paged attention: the fault of llama_paged_attn_inject_mask_fault, a test of the self-check. Drops the
// first entry that the paged mask keeps, in a page the kernel reads the mask of (every page of the token's list when
// mask_outside_pages, else those not marked GGML_FA_PAGE_UNMASKED, whose entries are left unwritten), of the ubatch's
// first token that has one (a decode row of a sequence in pages of its own has none: every page is marked). Returns
// false when no token has such an entry.
template<typename T>
static bool paged_mask_inject_fault(const paged_mask_args & args, T * paged, bool mask_outside_pages) {
    const auto & ubatch = args.ubatch;

    llama_pos pos_min[LLAMA_MAX_SEQ];
    ubatch_seq_pos_min(ubatch, pos_min);

    for (uint32_t i = 0; i < ubatch->n_tokens; ++i) {
        const llama_seq_id seq_id = ubatch->seq_id[i][0];
        T * row = paged + (size_t) args.n_kv*i;
        for (const auto & [j0, j1] : paged_mask_written_runs(args.v_cells[0], seq_id, pos_min[seq_id], args.n_kv,
                    mask_outside_pages)) {
            for (int64_t j = j0; j < j1; ++j) {
                if (llama_cast<float>(row[j]) == 0.0f) {
                    row[j] = llama_cast<T>(-INFINITY);
                    return true;
                }
            }
        }
    }
    return false;
}

} // namespace

void llama_kv_cache::set_input_kq_mask_paged(ggml_tensor * dst, const llama_ubatch * ubatch,
        const std::function<void(void *)> & llama_mask) const {
    const paged_mask_args args = { ubatch, v_cells, dst->ne[0] };
    bool ok = true;
    if (dst->type == GGML_TYPE_F16) {
        fill_paged_mask<ggml_fp16_t>(args, (ggml_fp16_t *) dst->data, mask_outside_pages, self_check);
        mask_fault = mask_fault && !paged_mask_inject_fault<ggml_fp16_t>(args, (ggml_fp16_t *) dst->data, mask_outside_pages);
        ok = !self_check || paged_mask_self_check<ggml_fp16_t>(args, (const ggml_fp16_t *) dst->data, mask_outside_pages, llama_mask);
    } else {
        fill_paged_mask<float>(args, (float *) dst->data, mask_outside_pages, self_check);
        mask_fault = mask_fault && !paged_mask_inject_fault<float>(args, (float *) dst->data, mask_outside_pages);
        ok = !self_check || paged_mask_self_check<float>(args, (const float *) dst->data, mask_outside_pages, llama_mask);
    }
    if (!ok) {
        self_check_failures++;
    }
}
