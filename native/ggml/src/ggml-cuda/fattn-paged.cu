// Paged flash attention over a unified KV.
//
// Small ubatches (decode, and a short chunk beside decode rows: at most GGML_CUDA_FATTN_PAGED_MAX_ROWS query
// rows) read only the pages each row's page table lists, instead of every cell up to the highest one in use.
//
// Work: one block per (query row, group of query heads sharing a KV head, split of the row's pages). The block
// loads each K and V row of its cells once for all the query heads of its group (GQA packing), in 16-byte loads:
// a cell is handled by D/8 lanes (8 halves each), so a warp takes 32/(D/8) cells at a time (4 at D = 64, 2 at
// 128, 1 at 256; D = 96 uses 12 of 16 lanes). Each group of lanes keeps an online softmax per head over its
// cells; the groups are merged in shared memory at the end. With one split the block writes the result; with
// several, each writes its unnormalised partial and (max, sum), and llama.cpp's flash_attn_combine_results
// merges the splits, as it does for its own split-KV kernels. The split count fills the GPU when few rows run.
//
// Pages: a row's header {n, tag, off, last} names its sequence's list and its own last entry
// (ggml_flash_attn_ext_set_pages); a page index may carry
// GGML_FA_PAGE_UNMASKED (the mask is 0 throughout the row's part of that page: it is not read there) and a cut
// (GGML_FA_PAGE_CUT: the row's part ends that many cells before the page does; the cells after are skipped, as are
// cells past the end of the KV); elsewhere the mask applies, so shared and partly filled pages stay exact. A
// decode row of a sequence in pages of its own reads no mask at all: its tail page is marked and cut.
//
// K/V F16, Q F32, DK == DV a 64, 96, 128 or 256; no ALiBi, soft-cap or sinks (those keep the dense kernels).
// Checked on an H200 (bench/paged_kernel_check.py in bench/device_suite.sh: 144 cases against the dense kernels and
// numpy, NaN where the kernel must not read the mask, the quick grid under compute-sanitizer's memcheck).

#include "common.cuh"
#include "fattn-common.cuh"
#include "fattn-paged.cuh"

#include <algorithm>
#include <cstdint>

static constexpr int PAGED_NWARPS    = 4;
static constexpr int PAGED_MAX_GROUP = 8;  // query heads per block (a larger GQA group takes several blocks)

template <int D, int G>
__launch_bounds__(PAGED_NWARPS*WARP_SIZE, 1)
static __global__ void flash_attn_ext_paged_f16(
        const char * __restrict__ Q, const char * __restrict__ K, const char * __restrict__ V,
        const char * __restrict__ mask, const char * __restrict__ pages,
        float * __restrict__ dst, float * __restrict__ dst_parts, float2 * __restrict__ dst_meta,
        const float scale, const int n_head, const int gqa_ratio, const int n_kv, const int page_size,
        const int64_t nbq1, const int64_t nbq2,
        const int64_t nbk1, const int64_t nbk2, const int64_t nbv1, const int64_t nbv2,
        const int64_t nbm1) {
    constexpr int LPC    = D/8 <= 8 ? 8 : (D/8 <= 16 ? 16 : 32);  // lanes per cell: D/8 rounded up to a power of 2
    constexpr int CPW    = WARP_SIZE/LPC;               // cells per warp at a time
    constexpr int GROUPS = PAGED_NWARPS*CPW;            // cell groups per block
    constexpr int PER    = 8;                           // halves per lane (one 16-byte load)

    const int row      = blockIdx.x;
    const int n_splits = gridDim.z;
    const int split    = blockIdx.z;
    const int groups_per_kv = gqa_ratio/G;
    const int hk       = blockIdx.y / groups_per_kv;
    const int head0    = hk*gqa_ratio + (blockIdx.y % groups_per_kv)*G;

    const int warp = threadIdx.x / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    const int sub  = lane % LPC;                        // which 8 halves of the head
    const int cg   = warp*CPW + lane/LPC;               // this lane's cell group
    const bool active = sub*PER < D;                    // D = 96: lanes 12..15 of a cell hold nothing

    float q[G][PER];
#pragma unroll
    for (int j = 0; j < G; ++j) {
        const float * q_row = (const float *) (Q + row*nbq1 + (head0 + j)*nbq2);
#pragma unroll
        for (int k = 0; k < PER; ++k) {
            q[j][k] = active ? q_row[sub*PER + k]*scale : 0.0f;
        }
    }

    // the row's header { n, tag, off, last }: its pages are its sequence's list at off but for its own last entry
    const int32_t * ptab  = (const int32_t *) pages;
    const int32_t * hrow  = ptab + GGML_FA_ROW_INTS*row;
    const int32_t * plist = ptab + hrow[2];
    const int32_t   plast = hrow[3];
    const half    * m_row = mask ? (const half *) (mask + row*nbm1) : nullptr;
    const int n_pages = hrow[0];
    const int p_begin = (int) (((int64_t) n_pages*split)/n_splits);
    const int p_end   = (int) (((int64_t) n_pages*(split + 1))/n_splits);
    const int n_cells = (p_end - p_begin)*page_size;

    float M[G];
    float S[G];
    float acc[G][PER];
#pragma unroll
    for (int j = 0; j < G; ++j) {
        M[j] = -INFINITY;
        S[j] = 0.0f;
#pragma unroll
        for (int k = 0; k < PER; ++k) {
            acc[j][k] = 0.0f;
        }
    }

    // Every lane of a cell group runs every iteration (the dot products are reduced across the group's lanes
    // with shuffles), so cells past the split's end or outside the KV are computed as invisible, not skipped.
    // An iteration takes U cells per cell group and issues all their K and V loads before using any: one load in
    // flight per lane left the kernel bound by memory latency at about a third of the bandwidth dense reached (first
    // GPU run, bench/paged_kernel_check.py --time). The U cells then update the softmax with one rescale.
    constexpr int U = G <= 4 ? 4 : 1;  // larger GQA groups hold more registers per cell already
    const int n_iter = (n_cells + GROUPS*U - 1)/(GROUPS*U);
    for (int it = 0; it < n_iter; ++it) {
        bool  visible[U];
        int   c[U];
        float mv[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int i = (it*U + u)*GROUPS + cg;
            visible[u] = i < n_cells;
            c[u]  = 0;
            mv[u] = 0.0f;
            if (visible[u]) {
                const int     jp = p_begin + i/page_size;
                const int32_t p  = jp + 1 < n_pages ? plist[jp] : plast;
                c[u] = (p & GGML_FA_PAGE_INDEX)*page_size + i%page_size;
                visible[u] = c[u] < n_kv && i%page_size < page_size - GGML_FA_PAGE_CUT(p);
                if (visible[u] && m_row && !(p & GGML_FA_PAGE_UNMASKED)) {
                    mv[u] = __half2float(m_row[c[u]]);
                    visible[u] = mv[u] != -INFINITY;
                }
            }
        }

        uint4 k_raw[U];
        uint4 v_raw[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (visible[u] && active) {
                k_raw[u] = *(const uint4 *) (K + c[u]*nbk1 + hk*nbk2 + sub*PER*sizeof(half));
                v_raw[u] = *(const uint4 *) (V + c[u]*nbv1 + hk*nbv2 + sub*PER*sizeof(half));
            } else {
                k_raw[u] = make_uint4(0, 0, 0, 0);
                v_raw[u] = make_uint4(0, 0, 0, 0);
            }
        }

        float s[U][G];
        bool any_visible = false;
#pragma unroll
        for (int u = 0; u < U; ++u) {
            any_visible = any_visible || visible[u];
            float kf[PER];
            const half2 * kh = (const half2 *) &k_raw[u];
#pragma unroll
            for (int k = 0; k < PER/2; ++k) {
                const float2 f = __half22float2(kh[k]);
                kf[2*k] = f.x;
                kf[2*k + 1] = f.y;
            }
#pragma unroll
            for (int j = 0; j < G; ++j) {
                float d = 0.0f;
#pragma unroll
                for (int k = 0; k < PER; ++k) {
                    d += q[j][k]*kf[k];
                }
#pragma unroll
                for (int off = LPC/2; off > 0; off >>= 1) {
                    d += __shfl_xor_sync(0xffffffff, d, off, LPC);
                }
                s[u][j] = visible[u] ? d + mv[u] : -INFINITY;
            }
        }
        if (!any_visible) {
            continue;  // uniform within the cell group: its lanes share i and c
        }

#pragma unroll
        for (int j = 0; j < G; ++j) {
            float M_new = M[j];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                M_new = fmaxf(M_new, s[u][j]);  // finite: at least one cell is visible
            }
            const float ms = expf(M[j] - M_new);  // 0 on the group's first visible cell (M = -inf)
#pragma unroll
            for (int k = 0; k < PER; ++k) {
                acc[j][k] *= ms;
            }
            S[j] *= ms;
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const float vs = expf(s[u][j] - M_new);  // 0 for an invisible cell (s = -inf)
                const half2 * vh = (const half2 *) &v_raw[u];
#pragma unroll
                for (int k = 0; k < PER/2; ++k) {
                    const float2 f = __half22float2(vh[k]);
                    acc[j][2*k]     += vs*f.x;
                    acc[j][2*k + 1] += vs*f.y;
                }
                S[j] += vs;
            }
            M[j] = M_new;
        }
    }

    // merge the cell groups' softmaxes per head
    __shared__ float sM[GROUPS][G];
    __shared__ float sS[GROUPS][G];
    __shared__ float sacc[GROUPS][G][D];
    if (sub == 0) {
#pragma unroll
        for (int j = 0; j < G; ++j) {
            sM[cg][j] = M[j];
            sS[cg][j] = S[j];
        }
    }
    if (active) {
#pragma unroll
        for (int j = 0; j < G; ++j) {
#pragma unroll
            for (int k = 0; k < PER; ++k) {
                sacc[cg][j][sub*PER + k] = acc[j][k];
            }
        }
    }
    __syncthreads();

    for (int t = threadIdx.x; t < G*D; t += PAGED_NWARPS*WARP_SIZE) {
        const int j = t / D;
        const int d = t % D;
        float M_all = -INFINITY;
#pragma unroll
        for (int g = 0; g < GROUPS; ++g) {
            M_all = fmaxf(M_all, sM[g][j]);
        }
        float S_all = 0.0f;
        float out   = 0.0f;
#pragma unroll
        for (int g = 0; g < GROUPS; ++g) {
            if (sS[g][j] == 0.0f) {
                continue;  // a group that saw no cell (M = -inf)
            }
            const float f = expf(sM[g][j] - M_all);
            S_all += sS[g][j]*f;
            out   += sacc[g][j][d]*f;
        }
        // dst: [D, n_head, n_rows] contiguous (permute(0, 2, 1, 3) of the heads)
        const int64_t j_dst = (int64_t) row*n_head + head0 + j;
        if (n_splits == 1) {
            dst[j_dst*D + d] = S_all == 0.0f ? 0.0f : out/S_all;
        } else {
            // flash_attn_combine_results' layout: [row][head][split][D] and a (max, sum) per split
            dst_parts[(j_dst*n_splits + split)*D + d] = out;
            if (d == 0) {
                dst_meta[j_dst*n_splits + split] = make_float2(M_all, S_all);
            }
        }
    }
}

bool ggml_cuda_flash_attn_ext_is_paged(const ggml_tensor * dst) {
    return dst->src[5] != nullptr && ggml_get_op_params_i32(dst, 5) > 0;
}

// what both paged paths (the kernel above, the MMA gather below) need: a page table, no ALiBi, no soft-cap
static bool paged_without_bias_or_softcap(const ggml_tensor * dst) {
    float max_bias = 0.0f;
    float logit_softcap = 0.0f;
    memcpy(&max_bias,      (const float *) dst->op_params + 1, sizeof(float));
    memcpy(&logit_softcap, (const float *) dst->op_params + 2, sizeof(float));
    return ggml_cuda_flash_attn_ext_is_paged(dst) && max_bias == 0.0f && logit_softcap == 0.0f;
}

bool ggml_cuda_flash_attn_ext_paged_supported(const ggml_tensor * dst) {
    const ggml_tensor * Q     = dst->src[0];
    const ggml_tensor * K     = dst->src[1];
    const ggml_tensor * V     = dst->src[2];
    const ggml_tensor * mask  = dst->src[3];
    const ggml_tensor * sinks = dst->src[4];

    // the 16-byte loads need 16-byte aligned K and V rows
    const auto aligned16 = [](const ggml_tensor * t) {
        return (uintptr_t) t->data % 16 == 0 && t->nb[1] % 16 == 0 && t->nb[2] % 16 == 0;
    };

    const int64_t D = K->ne[0];
    return paged_without_bias_or_softcap(dst) && sinks == nullptr &&
        Q->type == GGML_TYPE_F32 && K->type == GGML_TYPE_F16 && V->type == GGML_TYPE_F16 &&
        V->ne[0] == D && (D == 64 || D == 96 || D == 128 || D == 256) &&
        Q->ne[3] == 1 && K->ne[3] == 1 && Q->ne[2] % K->ne[2] == 0 &&
        (mask == nullptr || (mask->type == GGML_TYPE_F16 && mask->ne[2] == 1 && mask->ne[3] == 1)) &&
        Q->ne[1] <= GGML_CUDA_FATTN_PAGED_MAX_ROWS &&
        Q->nb[0] == sizeof(float) && K->nb[0] == sizeof(half) && V->nb[0] == sizeof(half) &&
        aligned16(K) && aligned16(V) &&
        ggml_is_contiguous(dst);
}

// query heads per block: the whole GQA group up to PAGED_MAX_GROUP, else its largest divisor that fits
static int paged_heads_per_block(const int gqa_ratio) {
    for (int g = std::min(gqa_ratio, PAGED_MAX_GROUP); g > 1; --g) {
        if (gqa_ratio % g == 0) {
            return g;
        }
    }
    return 1;
}

template <int D, int G>
static void launch_paged(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * Q     = dst->src[0];
    const ggml_tensor * K     = dst->src[1];
    const ggml_tensor * V     = dst->src[2];
    const ggml_tensor * mask  = dst->src[3];
    const ggml_tensor * pages = dst->src[5];

    float scale = 1.0f;
    memcpy(&scale, (const float *) dst->op_params + 0, sizeof(float));

    const int n_rows    = Q->ne[1];
    const int n_head    = Q->ne[2];
    const int gqa_ratio = Q->ne[2]/K->ne[2];
    const int page_size = ggml_get_op_params_i32(dst, 5);
    const int blocks_yx = n_rows*(n_head/G);

    // Splits of each row's pages: enough blocks for four per SM (up to three are resident at once with GQA groups of
    // up to 4 heads: 160 registers a thread), each split at least 4 of the widest row's pages (the KV's page count
    // bounds every row's); a row with fewer pages leaves some splits empty.
    const int nsm       = ggml_cuda_info().devices[ctx.device].nsm;
    const int max_pages = (int) ((K->ne[1] + page_size - 1)/page_size);
    int n_splits = std::max(1, (4*nsm + blocks_yx - 1)/blocks_yx);
    n_splits = std::min(n_splits, std::max(1, max_pages/4));
    n_splits = std::min(n_splits, 64);

    ggml_cuda_pool_alloc<float>  parts(ctx.pool());
    ggml_cuda_pool_alloc<float2> meta(ctx.pool());
    if (n_splits > 1) {
        parts.alloc((size_t) n_rows*n_head*n_splits*D);
        meta.alloc((size_t) n_rows*n_head*n_splits);
    }

    const dim3 grid(n_rows, n_head/G, n_splits);
    const dim3 block(PAGED_NWARPS*WARP_SIZE, 1, 1);
    flash_attn_ext_paged_f16<D, G><<<grid, block, 0, ctx.stream()>>>(
        (const char *) Q->data, (const char *) K->data, (const char *) V->data,
        mask ? (const char *) mask->data : nullptr, (const char *) pages->data,
        (float *) dst->data, parts.ptr, meta.ptr,
        scale, n_head, gqa_ratio, (int) K->ne[1], page_size,
        Q->nb[1], Q->nb[2], K->nb[1], K->nb[2], V->nb[1], V->nb[2],
        mask ? mask->nb[1] : 0);
    CUDA_CHECK(cudaGetLastError());

    if (n_splits > 1) {
        const dim3 grid_combine(n_rows, n_head, 1);
        flash_attn_combine_results<D><<<grid_combine, D, n_splits*sizeof(float2), ctx.stream()>>>(
            parts.ptr, meta.ptr, (float *) dst->data, n_splits);
        CUDA_CHECK(cudaGetLastError());
    }
}

template <int D>
static void launch_paged_group(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    switch (paged_heads_per_block((int) (dst->src[0]->ne[2]/dst->src[1]->ne[2]))) {
        case 1: launch_paged<D, 1>(ctx, dst); break;
        case 2: launch_paged<D, 2>(ctx, dst); break;
        case 3: launch_paged<D, 3>(ctx, dst); break;
        case 4: launch_paged<D, 4>(ctx, dst); break;
        case 5: launch_paged<D, 5>(ctx, dst); break;
        case 6: launch_paged<D, 6>(ctx, dst); break;
        case 7: launch_paged<D, 7>(ctx, dst); break;
        case 8: launch_paged<D, 8>(ctx, dst); break;
        default: GGML_ABORT("paged flash attention: unexpected heads per block");
    }
}

void ggml_cuda_flash_attn_ext_paged(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    switch (dst->src[1]->ne[0]) {
        case  64: launch_paged_group< 64>(ctx, dst); break;
        case  96: launch_paged_group< 96>(ctx, dst); break;
        case 128: launch_paged_group<128>(ctx, dst); break;
        case 256: launch_paged_group<256>(ctx, dst); break;
        default: GGML_ABORT("paged flash attention: unsupported head size %lld", (long long) dst->src[1]->ne[0]);
    }
}

// ------------------------------------------------------------------------------------------------------------------
// Paged prefill: index lists for the MMA kernel's sparse gather (fattn-mma-f16.cuh) from the page table.
//
// A prompt chunk's rows share one page list (rows with one tag have prefixes of one list: with a causal tail a row's
// list ends at its own cell), so a group of them writes its longest row's pages cell by cell: page k's cells go to
// [k*P, (k+1)*P) of the list, ascending because the pages are. A group
// of rows with different lists (decode rows beside a chunk, a chunk's first rows after them) takes the union: each
// row's pages set bits in the group's bitmap, and a scan over the bitmap's words gives each page its rank. Only the
// KV's last page can be cut short (cells past K->ne[1]), and it is the highest, so it ends every list that holds it.
// Within the pages the mask still applies (causality, other sequences' cells in a shared page): the kernel gathers
// it per cell, and llama.cpp writes the complete mask whenever an accelerator is present. So marks are not needed
// here, and a page cut short (GGML_FA_PAGE_CUT) is gathered whole: the mask drops the cells after its cut, and in a
// group's union another row may read the whole page.

static constexpr int PAGES_TO_INDICES_THREADS = 256;

// a query row's pages: its sequence's list, but for its own last entry (ggml_flash_attn_ext_set_pages)
struct paged_row {
    const int32_t * list;
    int             n;
    int             tag;
    int32_t         last;

    __device__ __forceinline__ int32_t at(const int j) const { return j + 1 < n ? list[j] : last; }
};

static __device__ __forceinline__ paged_row paged_row_of(const int32_t * __restrict__ table, const int q) {
    const int32_t * h = table + GGML_FA_ROW_INTS*q;
    return { table + h[2], h[0], h[1], h[3] };
}

static __global__ void flash_attn_pages_to_sparse_indices(
        const int32_t * __restrict__ pages, const int n_rows, const int ncols1,
        const int page_size, const int n_kv, uint32_t * __restrict__ bitmaps, const int n_words,
        int32_t * __restrict__ indices, int32_t * __restrict__ counts, const int n_kv_max) {
    constexpr int nwarps = PAGES_TO_INDICES_THREADS/WARP_SIZE;

    const int group = blockIdx.x;
    const int tid   = threadIdx.x;
    const int warp  = tid / WARP_SIZE;
    const int lane  = tid % WARP_SIZE;
    const int q0    = group*ncols1;
    const int q1    = min(q0 + ncols1, n_rows);

    int32_t  * list = indices + int64_t(group)*n_kv_max;
    uint32_t * bits = bitmaps + int64_t(group)*n_words;
    const int n_pages_kv = (n_kv + page_size - 1)/page_size;

    auto row_of = [&](const int q) { return paged_row_of(pages, q); };

    __shared__ int one_list;
    __shared__ int longest;
    __shared__ int warp_offsets[nwarps];
    __shared__ int chunk_pages;
    __shared__ int n_pages;

    if (tid == 0) {
        one_list = 1;
        n_pages  = 0;
        longest  = q0;
    }
    __syncthreads();
    for (int q = q0 + 1 + tid; q < q1; q += blockDim.x) {
        if (row_of(q).tag != row_of(q0).tag) {
            one_list = 0;  // every writer writes 0
        }
    }
    __syncthreads();
    if (one_list && tid == 0) {
        for (int q = q0 + 1; q < q1; ++q) {
            if (row_of(q).n > row_of(longest).n) {
                longest = q;  // the union of prefixes of one list: the longest (a cut only shortens a page, gathered whole)
            }
        }
    }
    __syncthreads();

    if (one_list) {
        const paged_row row = row_of(longest);
        const int n = row.n;
        for (int i = tid; i < n*page_size; i += blockDim.x) {
            const int cell = (row.at(i/page_size) & GGML_FA_PAGE_INDEX)*page_size + i % page_size;
            if (cell < n_kv) {
                list[i] = cell;
            }
        }
        if (tid == 0) {
            n_pages = n;
        }
    } else {
        for (int w = tid; w < n_words; w += blockDim.x) {
            bits[w] = 0;
        }
        __syncthreads();
        for (int q = q0; q < q1; ++q) {
            const paged_row row = row_of(q);
            if (q > q0 && row.tag == row_of(q - 1).tag && row.n <= row_of(q - 1).n) {
                continue;  // a prefix of the previous row's list (rows of one tag: prefixes of one list)
            }
            for (int k = tid; k < row.n; k += blockDim.x) {
                const int p = row.at(k) & GGML_FA_PAGE_INDEX;
                atomicOr(bits + p/32, 1u << (p % 32));
            }
        }
        __syncthreads();

        // pages in ascending order: each thread takes a word, the block scans the words' page counts
        for (int w0 = 0; w0 < n_words; w0 += blockDim.x) {
            const int w = w0 + tid;
            const uint32_t word = w < n_words ? bits[w] : 0;
            const int c = __popc(word);
            const int x = warp_prefix_inclusive_sum<int>(c);
            if (lane == WARP_SIZE - 1) {
                warp_offsets[warp] = x;
            }
            __syncthreads();
            if (tid == 0) {
                int offset = 0;
                for (int iw = 0; iw < nwarps; ++iw) {
                    const int t = warp_offsets[iw];
                    warp_offsets[iw] = offset;
                    offset += t;
                }
                chunk_pages = offset;
            }
            __syncthreads();

            int rank = n_pages + warp_offsets[warp] + x - c;
            for (uint32_t m = word; m != 0; m &= m - 1) {
                const int p = w*32 + __ffs(m) - 1;
                for (int i = 0; i < page_size; ++i) {
                    const int cell = p*page_size + i;
                    if (cell < n_kv) {
                        list[rank*page_size + i] = cell;
                    }
                }
                ++rank;
            }
            __syncthreads();
            if (tid == 0) {
                n_pages += chunk_pages;
            }
            __syncthreads();
        }
    }
    __syncthreads();

    // the highest page is the KV's last one only if the list holds it; it may be cut short
    int count = n_pages*page_size;
    if (n_pages > 0) {
        const bool holds_last = one_list ?
            (row_of(longest).at(n_pages - 1) & GGML_FA_PAGE_INDEX) == n_pages_kv - 1 :
            (bits[(n_pages_kv - 1)/32] >> ((n_pages_kv - 1) % 32)) & 1;
        if (holds_last) {
            count -= n_pages_kv*page_size - n_kv;
        }
    }
    count = min(count, n_kv_max);
    // -1 up to n_kv_max, as llama.cpp's compaction writes: the MMA kernel splits each list's n_kv_max range among
    // blocks (stream-k), and a block whose share of a tile starts past the list's end still reads one KV tile there
    for (int i = count + tid; i < n_kv_max; i += blockDim.x) {
        list[i] = -1;
    }
    if (tid == 0) {
        counts[group] = count;
    }
}

bool ggml_cuda_flash_attn_ext_paged_gather_applies(const int cc, const ggml_tensor * dst) {
    const ggml_tensor * Q    = dst->src[0];
    const ggml_tensor * K    = dst->src[1];
    const ggml_tensor * mask = dst->src[3];

    // Turing's MMA kernel has tiles of at most 32 columns, which the gather's template cases do not include
    return paged_without_bias_or_softcap(dst) && GGML_CUDA_CC_IS_NVIDIA(cc) && ampere_mma_available(cc) &&
        Q->ne[3] == 1 &&
        mask != nullptr && mask->ne[0] == K->ne[1] && mask->ne[1] >= Q->ne[1] && mask->ne[2] == 1 && mask->ne[3] == 1 &&
        dst->src[5]->type == GGML_TYPE_I32 && dst->src[5]->ne[0] >= GGML_FA_ROW_INTS*Q->ne[1];
}

void ggml_cuda_flash_attn_ext_pages_to_indices(ggml_backend_cuda_context & ctx, const ggml_tensor * dst,
        int32_t * indices, int32_t * counts, const int ncols1, const int32_t n_kv_max, cudaStream_t stream) {
    const ggml_tensor * Q     = dst->src[0];
    const ggml_tensor * K     = dst->src[1];
    const ggml_tensor * pages = dst->src[5];

    const int page_size = ggml_get_op_params_i32(dst, 5);
    const int n_rows    = (int) Q->ne[1];
    const int n_kv      = (int) K->ne[1];
    const int n_lists   = (n_rows + ncols1 - 1)/ncols1;
    const int n_words   = ((n_kv + page_size - 1)/page_size + 31)/32;
    GGML_ASSERT(n_kv_max >= n_kv);

    ggml_cuda_pool_alloc<uint32_t> bitmaps(ctx.pool(), (size_t) n_lists*n_words);
    flash_attn_pages_to_sparse_indices<<<n_lists, PAGES_TO_INDICES_THREADS, 0, stream>>>(
        (const int32_t *) pages->data, n_rows, ncols1, page_size, n_kv, bitmaps.ptr, n_words,
        indices, counts, n_kv_max);
    CUDA_CHECK(cudaGetLastError());
}
