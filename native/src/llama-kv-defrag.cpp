// Defragmentation of paged attention's pages (Arbor): llama_kv_cache::paged_defrag, declared in llama-kv-cache.h by
// the topic "llama: the KV cache in pages"; llama_paged_attn_defrag calls it.

#include "llama-kv-cache.h"
#include "llama-impl.h"
#include "llama-model.h"

#include <algorithm>
#include <map>
#include <vector>

// Defragmentation. A page is mixed when its cells carry different sets of sequences. Its owner is
// the set with the most cells there (the first cell's set on a tie); every other cell of it is a stray. The strays of
// one set go, in order of position, first into the empty cells of pages that hold that set's cells alone, then into
// free pages. A stray with nowhere to go stays (the cache is still full; the page keeps reading its mask, so attention
// stays right). Each move copies the cell's K and V rows in every layer (through the backend API, so any buffer) and
// then moves its bookkeeping (llama_kv_cells::mv), which keeps the per-sequence page counts.
int32_t llama_kv_cache::paged_defrag() {
    if (other || n_stream != 1 || v_trans || v_cells.empty() || v_cells[0].get_page_size() == 0) {
        return -1;
    }
    if (!own_pages) {
        return -3;
    }
    auto & cells = v_cells[0];
    if (cells.get_has_shift()) {
        return -2;
    }
    using seq_set_t = llama_kv_cells::seq_set_t;

    const uint32_t page_size = cells.get_page_size();
    const uint32_t n_cells   = cells.size();
    const uint32_t n_pages   = cells.n_pages();

    struct group {
        seq_set_t set;
        std::vector<std::pair<llama_pos, uint32_t>> strays; // (position, cell)
        std::vector<uint32_t> clean_pages;                  // pages whose used cells all carry this set
    };
    std::vector<group> groups;
    auto group_of = [&](const seq_set_t & set) -> group & {
        for (auto & g : groups) {
            if (g.set == set) {
                return g;
            }
        }
        groups.push_back({ set, {}, {} });
        return groups.back();
    };

    std::vector<std::pair<seq_set_t, uint32_t>> counts; // per page: each set and its cells there
    for (uint32_t p = 0; p < n_pages; ++p) {
        if (cells.page_is_free(p)) {
            continue;
        }
        const uint32_t end = std::min<uint32_t>((p + 1) * page_size, n_cells);
        counts.clear();
        for (uint32_t i = p * page_size; i < end; ++i) {
            if (cells.is_empty(i)) {
                continue;
            }
            const seq_set_t & set = cells.seq_set_get(i);
            bool found = false;
            for (auto & c : counts) {
                if (c.first == set) {
                    c.second++;
                    found = true;
                    break;
                }
            }
            if (!found) {
                counts.push_back({ set, 1 });
            }
        }
        if (counts.size() == 1) {
            group_of(counts[0].first).clean_pages.push_back(p);
            continue;
        }
        size_t owner = 0;
        for (size_t k = 1; k < counts.size(); ++k) {
            if (counts[k].second > counts[owner].second) {
                owner = k;
            }
        }
        for (uint32_t i = p * page_size; i < end; ++i) {
            if (!cells.is_empty(i) && cells.seq_set_get(i) != counts[owner].first) {
                group_of(cells.seq_set_get(i)).strays.push_back({ cells.pos_get(i), i });
            }
        }
    }

    std::vector<std::pair<uint32_t, uint32_t>> moves; // (from, to)
    std::vector<bool> claimed(n_pages, false);         // free pages given to a set in this pass
    uint32_t page_scan = 0;
    for (auto & g : groups) {
        if (g.strays.empty()) {
            continue;
        }
        std::sort(g.strays.begin(), g.strays.end());
        size_t next = 0;
        for (uint32_t p : g.clean_pages) {
            const uint32_t end = std::min<uint32_t>((p + 1) * page_size, n_cells);
            for (uint32_t i = p * page_size; i < end && next < g.strays.size(); ++i) {
                if (cells.is_empty(i)) {
                    moves.push_back({ g.strays[next++].second, i });
                }
            }
        }
        while (next < g.strays.size()) {
            int32_t page = -1;
            for (; page_scan < n_pages; ++page_scan) {
                if (!claimed[page_scan] && cells.page_is_free(page_scan)) {
                    page = (int32_t) page_scan;
                    claimed[page_scan] = true;
                    break;
                }
            }
            if (page < 0) {
                break; // no free page left: the remaining strays stay where they are
            }
            const uint32_t end = std::min<uint32_t>((page + 1) * page_size, n_cells);
            for (uint32_t i = page * page_size; i < end && next < g.strays.size(); ++i) {
                moves.push_back({ g.strays[next++].second, i });
            }
        }
    }

    std::vector<uint8_t> row;
    for (const auto & layer : layers) {
        for (ggml_tensor * t : { layer.k, layer.v }) {
            if (t == nullptr) {
                continue; // a K-only (MLA) cache
            }
            const size_t row_size = ggml_row_size(t->type, t->ne[0]);
            row.resize(row_size);
            for (const auto & m : moves) {
                ggml_backend_tensor_get(t, row.data(), m.first  * t->nb[1], row_size);
                ggml_backend_tensor_set(t, row.data(), m.second * t->nb[1], row_size);
            }
        }
    }
    for (const auto & m : moves) {
        cells.mv(m.first, m.second);
    }

    return (int32_t) moves.size();
}
