// Paged attention's C API (Arbor): llama_set_paged_attn and the rest of its functions in llama.h, and the context's
// switch behind it (llama_context::set_paged_attn), declared by the topic "llama: paged attention in the graph and the
// C API". The KV cache's side is in llama-kv-pages.cpp, llama-kv-defrag.cpp and llama-kv-paged-mask.cpp.

#include "llama-context.h"
#include "llama-impl.h"
#include "llama-kv-cache.h"
#include "llama-model.h"

#include <algorithm>
#include <vector>

int32_t llama_context::set_paged_attn(uint32_t page_size) {
    if (page_size == cparams.paged_attn_page_size) {
        return 0;
    }

    auto * kv = dynamic_cast<llama_kv_cache *>(memory.get());
    if (page_size > 0) {
        if (!cparams.flash_attn) {
            return -1;
        }
        if (!kv || !cparams.kv_unified || kv->get_n_stream() != 1 || model.hparams.swa_type != LLAMA_SWA_TYPE_NONE) {
            return -2;
        }
        if (!kv->buffers_have_paged_kernel()) {
            return -3;
        }
        if (page_size > kv->get_size()) {
            return -4;
        }
        if (page_size > GGML_FA_PAGE_SIZE_MAX || (kv->get_size() + page_size - 1)/page_size > GGML_FA_PAGE_COUNT_MAX) {
            return -5; // a page-table entry holds the page index and the page's cut in one int32
        }
    }

    LLAMA_LOG_INFO("%s: paged attention %s (page size %u cells)\n", __func__, page_size ? "on" : "off", page_size);

    if (kv) {
        // with no accelerator every attention that reads the page table runs on the CPU kernel, which never reads the
        // mask outside the pages; attentions without the table get the full mask (set_input_kq_mask's paged_attn)
        kv->set_page_size(page_size, /*mask_outside_pages =*/ !model.devices.empty());
    }
    cparams.paged_attn_page_size = page_size;

    // the attention graphs gain or lose an input
    sched_need_reserve = true;

    return 0;
}

uint32_t llama_context::get_paged_attn() const {
    return cparams.paged_attn_page_size;
}

int32_t llama_set_paged_attn(llama_context * ctx, uint32_t page_size) {
    return ctx->set_paged_attn(page_size);
}

uint32_t llama_get_paged_attn(const llama_context * ctx) {
    return ctx->get_paged_attn();
}

int32_t llama_set_paged_attn_own_pages(llama_context * ctx, bool own_pages) {
    auto * kv = dynamic_cast<llama_kv_cache *>(ctx->get_memory());
    if (!kv) {
        return -2;
    }
    kv->set_own_pages(own_pages);
    return 0;
}

int32_t llama_paged_attn_defrag(llama_context * ctx) {
    auto * kv = dynamic_cast<llama_kv_cache *>(ctx->get_memory());
    if (!kv) {
        return -1;
    }
    return kv->paged_defrag();
}

int32_t llama_set_paged_attn_self_check(llama_context * ctx, bool on) {
    auto * kv = dynamic_cast<llama_kv_cache *>(ctx->get_memory());
    if (!kv) {
        return -2;
    }
    kv->set_self_check(on);
    return 0;
}

int64_t llama_get_paged_attn_self_check_failures(const llama_context * ctx) {
    const auto * kv = dynamic_cast<const llama_kv_cache *>(ctx->get_memory());
    return kv ? kv->get_self_check_failures() : -2;
}

int32_t llama_get_paged_attn_self_check(const llama_context * ctx) {
    const auto * kv = dynamic_cast<const llama_kv_cache *>(ctx->get_memory());
    return kv ? (kv->get_self_check() ? 1 : 0) : -2;
}

int32_t llama_paged_attn_inject_mask_fault(llama_context * ctx) {
    auto * kv = dynamic_cast<llama_kv_cache *>(ctx->get_memory());
    if (!kv) {
        return -2;
    }
    kv->inject_mask_fault();
    return 0;
}

int32_t llama_get_paged_attn_seq_pages(const llama_context * ctx, llama_seq_id seq_id, int32_t * out, int32_t n_max) {
    const auto * kv = dynamic_cast<const llama_kv_cache *>(ctx->get_memory());
    if (!kv || kv->get_page_size() == 0 || seq_id < 0 || seq_id >= (llama_seq_id) ctx->n_seq_max()) {
        return -1;
    }
    const uint32_t n_pages = (kv->get_size() + kv->get_page_size() - 1) / kv->get_page_size();
    std::vector<int32_t> pages(n_pages);
    const uint32_t n = kv->seq_pages_get(seq_id, pages.data(), n_pages);
    for (int32_t i = 0; i < std::min<int32_t>(n_max, (int32_t) n); ++i) {
        out[i] = pages[i];
    }
    return (int32_t) n;
}
