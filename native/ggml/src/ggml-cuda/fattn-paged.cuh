#pragma once

// Paged flash attention over a unified KV, see fattn-paged.cu.

#include "common.cuh"

// ubatches with more query rows than this keep the dense kernels (the paged kernel reads each row's
// pages once per row and group of query heads; for long prefills the tensor-core kernels win)
#define GGML_CUDA_FATTN_PAGED_MAX_ROWS 64

bool ggml_cuda_flash_attn_ext_paged_supported(const ggml_tensor * dst);

void ggml_cuda_flash_attn_ext_paged(ggml_backend_cuda_context & ctx, ggml_tensor * dst);

// Paged prefill: a paged ubatch that the kernel above does not take (more rows) runs llama.cpp's MMA
// kernel with its sparse gather (fattn-mma-f16.cuh), over index lists built from the page table rather than
// compacted from the mask, for these head sizes and its 64-column tiles (ncols1*ncols2 == 64, Ampere and later).
static constexpr __host__ __device__ bool ggml_cuda_flash_attn_ext_mma_f16_may_use_paged_gather(
        const int DKQ, const int DV, const int ncols1, const int ncols2) {
    return DKQ == DV && (DKQ == 64 || DKQ == 96 || DKQ == 128 || DKQ == 256) && ncols1*ncols2 == 64 && ncols2 <= 8;
}

// whether dst carries a page table (ggml_flash_attn_ext_set_pages)
bool ggml_cuda_flash_attn_ext_is_paged(const ggml_tensor * dst);

// whether the MMA kernel's gather may run dst from its page table (a paged op, NVIDIA Ampere or later, a mask of one
// sequence, no ALiBi or soft-cap); the head size and tile are checked by ..._may_use_paged_gather
bool ggml_cuda_flash_attn_ext_paged_gather_applies(int cc, const ggml_tensor * dst);

// For each group of ncols1 query rows of dst, the ascending KV cells of the union of the rows' pages (cut at the KV's
// end) into indices[group*n_kv_max ...], then -1 up to n_kv_max (as llama.cpp's compaction does), and their count into
// counts[group]: what ggml_cuda_flash_attn_ext_compact_mask writes from the mask. n_kv_max >= K->ne[1].
void ggml_cuda_flash_attn_ext_pages_to_indices(ggml_backend_cuda_context & ctx, const ggml_tensor * dst,
        int32_t * indices, int32_t * counts, int ncols1, int32_t n_kv_max, cudaStream_t stream);
