// Paged attention's pages in llama.cpp's KV cache (Arbor): placement of each sequence in pages of its own, a
// sequence's pages, the ubatch's page table, and the switches. These are members of llama_kv_cache and
// llama_kv_cache_context, declared in llama-kv-cache.h by the topic "llama: the KV cache in pages", which hooks the
// placement into find_slot; llama_kv_cells (llama-kv-cells.h, same topic) keeps the per-sequence page counts.

#include "llama-kv-cache.h"
#include "llama-kv-pages.h"
#include "llama-impl.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <unordered_map>
#include <utility>
#include <vector>

// Paged attention: a sequence's attention walks the pages in which it owns cells, so a page
// shared by the decode tokens of several sequences is walked by all of them (8 sequences decoding together
// would each walk 8 cells per generated token). Here a token goes, in order of preference:
//   1. into the page its sequence (the token's first sequence id) is filling, after the cells it holds there:
//      the page of the sequence's last cell when no other sequence owns a cell there, or the page this
//      ubatch gave the sequence;
//   2. into the first free page (no cell of it in use) after the sequence's last cell (after the search
//      head for a sequence with no cells), which the sequence then fills;
//   3. into any free cell (the cache is full of partly used pages): still correct, since the mask applies
//      inside each page, only no longer exclusive.
// So a page is shared only when several sequences hold its cells through seq_cp (a shared prefix, whose
// last page may be partial) or when the cache is too full for step 2. Cell order does not matter for which
// cells are read (attention reads positions), but it is the order the kernel sums them in:
// so a sequence fills its tail page after its last cell and looks for its next free page after that one, and its
// cells ascend with its positions as with llama.cpp's placement (F16 accumulation makes logits depend slightly on
// that order, and two engines that computed the same prefix should sum it alike).
bool llama_kv_cache::find_slot_paged(const llama_ubatch & ubatch, const llama_kv_cells & cells, uint32_t head_cur,
                                     std::vector<uint32_t> & idxs) const {
    const uint32_t page_size = cells.get_page_size();
    const uint32_t n_cells   = cells.size();
    const uint32_t n_pages   = cells.n_pages();

    // this ubatch's own bookkeeping: find_slot does not touch the cells
    std::vector<bool> taken(n_cells, false);
    std::vector<bool> claimed(n_pages, false);

    struct filling {
        bool    known = false;
        int32_t page  = -1; // the page the sequence fills, -1 when none
        uint32_t next = 0;  // the first cell of that page not yet looked at
        int32_t after = -1; // the page of the sequence's last cell: its next free page is searched after it
    };
    std::vector<filling> fill(LLAMA_MAX_SEQ);

    uint32_t page_scan = std::min(head_cur / page_size, n_pages - 1); // where the search for a free page goes on
    uint32_t cell_scan = head_cur < n_cells ? head_cur : 0;           // where the search for any free cell goes on
    uint32_t cell_scanned = 0;

    for (uint32_t i = 0; i < ubatch.n_tokens; ++i) {
        const llama_seq_id seq_id = ubatch.seq_id[i][0];
        auto & f = fill[seq_id];

        if (!f.known) {
            f.known = true;
            const int32_t last = cells.seq_last_cell(seq_id);
            if (last >= 0) {
                f.after = last / page_size;
                if (cells.page_owned_only_by(last / page_size, seq_id)) {
                    f.page = last / page_size;
                    f.next = last + 1;
                }
            }
        }

        int32_t idx = -1;

        if (f.page >= 0) {
            const uint32_t end = std::min<uint32_t>((f.page + 1) * page_size, n_cells);
            for (uint32_t j = f.next; j < end; ++j) {
                if (cells.is_empty(j) && !taken[j]) {
                    idx = j;
                    f.next = j + 1;
                    break;
                }
            }
        }

        if (idx < 0) {
            f.page = -1;
            const uint32_t start = f.after >= 0 ? (f.after + 1) % n_pages : page_scan;
            for (uint32_t k = 0; k < n_pages; ++k) {
                const uint32_t p = (start + k) % n_pages;
                if (!claimed[p] && cells.page_is_free(p)) {
                    claimed[p] = true;
                    page_scan  = (p + 1) % n_pages;
                    f.after = p;
                    f.page = p;
                    f.next = p * page_size + 1;
                    idx    = p * page_size;
                    break;
                }
            }
        }

        if (idx < 0) {
            while (cell_scanned < n_cells) {
                const uint32_t j = cell_scan;
                cell_scan = (cell_scan + 1) % n_cells;
                cell_scanned++;
                if (cells.is_empty(j) && !taken[j]) {
                    idx = j;
                    break;
                }
            }
        }

        if (idx < 0) {
            return false;
        }

        taken[idx] = true;
        if (!claimed[idx / page_size]) {
            // a cell of a partly used page: that page is no longer free for another sequence of this ubatch
            claimed[idx / page_size] = true;
        }
        idxs.push_back(idx);
    }

    return true;
}

uint32_t llama_kv_cache::seq_pages_get(llama_seq_id seq_id, int32_t * out, uint32_t n_pages_max) const {
    GGML_ASSERT(seq_id >= 0 && (size_t) seq_id < seq_to_stream.size());
    return v_cells[seq_to_stream[seq_id]].seq_pages_get(seq_id, out, n_pages_max);
}

// the pages of seq_id (at most n_pages_max), marked and with its causal tail when `mark` (the paged mask applies)
paged_seq_pages paged_seq_pages_get(const llama_kv_cells & cells, llama_seq_id seq_id, llama_pos pos_min,
        uint32_t n_pages_max, bool mark) {
    const uint32_t page_size = cells.get_page_size();

    paged_seq_pages sp;
    sp.list.resize(n_pages_max);
    sp.list.resize(cells.seq_pages_get(seq_id, sp.list.data(), n_pages_max));
    if (!mark) {
        return sp;
    }
    for (int32_t & entry : sp.list) {
        const int32_t cut = cells.seq_page_mark(seq_id, (uint32_t) entry, pos_min);
        if (cut >= 0) {
            entry |= GGML_FA_PAGE_UNMASKED | (cut << GGML_FA_PAGE_CUT_SHIFT);
        }
    }
    // the tail, from the list's end back to the first page that is marked, does not hold the sequence's cells from its
    // start, or would put a later position before an earlier one
    std::vector<std::vector<llama_pos>> tail_pages; // the tail pages' positions, last page first
    llama_pos next = std::numeric_limits<llama_pos>::max(); // the lowest position of the tail so far
    int32_t tail = (int32_t) sp.list.size();
    while (tail > 0 && !(sp.list[tail - 1] & GGML_FA_PAGE_UNMASKED)) {
        const uint32_t page = sp.list[tail - 1];
        const int32_t  cut  = cells.seq_page_mark(seq_id, page, std::numeric_limits<llama_pos>::max());
        if (cut < 0) {
            break;
        }
        std::vector<llama_pos> pos;
        for (uint32_t c = page*page_size; c < (page + 1)*page_size - cut; ++c) {
            pos.push_back(cells.pos_get(c));
        }
        if (!std::is_sorted(pos.begin(), pos.end()) || pos.back() > next) {
            break;
        }
        next = pos.front();
        tail_pages.push_back(std::move(pos));
        --tail;
    }
    if (tail_pages.empty()) {
        return sp; // no unmarked page ends the list as a causal tail (a decode row of pages of its own: none at all)
    }
    sp.tail = tail;
    for (auto it = tail_pages.rbegin(); it != tail_pages.rend(); ++it) {
        sp.tail_pos.insert(sp.tail_pos.end(), it->begin(), it->end());
        sp.tail_cells.push_back((int32_t) sp.tail_pos.size());
    }
    return sp;
}

bool llama_kv_cache::paged_mask_applies(const llama_ubatch * ubatch, bool causal_attn) const {
    // as set_input_kq_mask: only the SWA cache (or the SWA layers of a single cache) become non-causal
    if (!causal_attn && hparams.non_causal_type == LLAMA_NON_CAUSAL_TYPE_SWA_ONLY) {
        causal_attn = swa_type == LLAMA_SWA_TYPE_NONE;
    }
    return get_page_size() > 0 && n_stream == 1 && causal_attn && swa_type == LLAMA_SWA_TYPE_NONE &&
        !hparams.use_alibi && !ubatch->is_pos_2d();
}

void llama_kv_cache::set_page_size(uint32_t page_size, bool mask_outside_pages) {
    GGML_ASSERT(page_size == 0 || n_stream == 1);
    for (auto & cells : v_cells) {
        cells.set_page_size(page_size);
    }
    this->mask_outside_pages = mask_outside_pages;
}

bool llama_kv_cache::buffers_have_paged_kernel() const {
    for (const auto & [ctx, buf] : ctxs_bufs) {
        GGML_UNUSED(ctx);
        if (ggml_backend_buffer_is_host(buf.get())) {
            continue; // the CPU backend
        }
        ggml_backend_dev_t dev = ggml_backend_buft_get_device(ggml_backend_buffer_get_type(buf.get()));
        ggml_backend_reg_t reg = dev ? ggml_backend_dev_backend_reg(dev) : nullptr;
        if (!reg || strcmp(ggml_backend_reg_name(reg), "CUDA") != 0) {
            return false;
        }
    }
    return true;
}

uint32_t llama_kv_cache::get_page_size() const {
    return v_cells.empty() ? 0 : v_cells[0].get_page_size();
}

ggml_tensor * llama_kv_cache::build_input_kv_pages(ggml_context * ctx, const llama_ubatch & ubatch, uint32_t n_kv) const {
    ggml_tensor * res = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, kv_pages_size(ubatch, n_kv));
    ggml_set_input(res);
    ggml_set_name(res, "attn_inp_kv_pages");

    return res;
}

int64_t llama_kv_cache::kv_pages_size(const llama_ubatch & ubatch, uint32_t n_kv) const {
    const uint32_t page_size = get_page_size();
    GGML_ASSERT(page_size > 0);

    // a header per token, then a list of at most every page per sequence of the ubatch
    const int64_t n_pages_max = (n_kv + page_size - 1)/page_size;
    return GGML_FA_ROW_INTS*(int64_t) ubatch.n_tokens + (int64_t) ubatch.n_seqs_unq*n_pages_max;
}

void llama_kv_cache::set_input_kv_pages(ggml_tensor * dst, const llama_ubatch * ubatch, bool causal_attn) const {
    GGML_ASSERT(ggml_backend_buffer_is_host(dst->buffer));
    GGML_ASSERT(n_stream == 1);

    const auto & cells = v_cells[0];

    const uint32_t n_tokens  = ubatch->n_tokens;
    const uint32_t page_size = cells.get_page_size();

    GGML_ASSERT(ubatch->n_seqs_unq > 0 && dst->ne[0] >= GGML_FA_ROW_INTS*(int64_t) n_tokens);
    const uint32_t n_pages_max = (uint32_t) ((dst->ne[0] - GGML_FA_ROW_INTS*(int64_t) n_tokens)/ubatch->n_seqs_unq);

    int32_t * data = (int32_t *) dst->data;

    // tokens of one sequence share one page list, built once (the same rule as the mask: a token attends as its first
    // sequence id); a page is marked unmasked for the lowest position of its sequence in the ubatch, so the mark holds
    // for each of the sequence's tokens, and with a causal tail each token's list ends at its last cell (the mask
    // builder leaves the same pages unwritten: set_input_kq_mask_paged). The list written is that of the sequence's
    // highest position in the ubatch; every other token's is a prefix of it but for its last entry, which its header
    // carries (ggml_flash_attn_ext_set_pages)
    const bool mark_unmasked = paged_mask_applies(ubatch, causal_attn);
    llama_pos pos_min[LLAMA_MAX_SEQ];
    ubatch_seq_pos_min(ubatch, pos_min);

    struct seq_list {
        paged_seq_pages pages;
        llama_pos       pos_max = -1;
        int32_t         off     = 0;
    };
    std::unordered_map<llama_seq_id, seq_list> lists;
    for (uint32_t i = 0; i < n_tokens; ++i) {
        const llama_seq_id seq_id = ubatch->seq_id[i][0];
        auto it = lists.find(seq_id);
        if (it == lists.end()) {
            it = lists.emplace(seq_id, seq_list{paged_seq_pages_get(cells, seq_id, pos_min[seq_id], n_pages_max,
                        mark_unmasked), -1, 0}).first;
        }
        it->second.pos_max = std::max(it->second.pos_max, ubatch->pos[i]);
    }

    int64_t off = GGML_FA_ROW_INTS*(int64_t) n_tokens;
    for (auto & [seq_id, sl] : lists) {
        GGML_ASSERT(off + n_pages_max <= dst->ne[0]);
        sl.off = (int32_t) off;
        off += sl.pages.row(sl.pos_max, page_size, data + off);
    }

    for (uint32_t i = 0; i < n_tokens; ++i) {
        const llama_seq_id seq_id = ubatch->seq_id[i][0];
        const seq_list & sl = lists.at(seq_id);
        int32_t * h = data + GGML_FA_ROW_INTS*i;
        h[0] = sl.pages.row_last(ubatch->pos[i], page_size, h[3]);
        h[1] = seq_id; // the tag: the token's sequence; its tokens' lists are prefixes of one list
        h[2] = sl.off;
    }
}

uint32_t llama_kv_cache_context::get_page_size() const {
    return kv->get_page_size();
}

ggml_tensor * llama_kv_cache_context::build_input_kv_pages(ggml_context * ctx, const llama_ubatch & ubatch) const {
    return kv->build_input_kv_pages(ctx, ubatch, n_kv);
}

int64_t llama_kv_cache_context::kv_pages_size(const llama_ubatch & ubatch) const {
    return kv->kv_pages_size(ubatch, n_kv);
}

void llama_kv_cache_context::set_input_kv_pages(ggml_tensor * dst, const llama_ubatch * ubatch, bool causal_attn) const {
    kv->set_input_kv_pages(dst, ubatch, causal_attn);
}
