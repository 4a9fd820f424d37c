// Paged flash attention on the CPU (Arbor): the GQA-packed per-row path and its per-batch plan (paged-flash-attn.h).

#include "paged-flash-attn.h"

#include "ops.h"
#include "simd-mappings.h"
#include "vec.h"

#include <algorithm>
#include <cstring>

// The paged per-row path: the query heads of one KV group in one pass over the cells (GQA packing).
// Each cell's mask value is read once, and its K and V rows once, for every head of the group, which reads them
// while they are in L1; llama.cpp's path walks every cell once per head. Per head the arithmetic is the one of
// ggml_compute_forward_flash_attn_ext_f16_one_chunk, over the same cells in the same order: the same values, bit
// for bit. Items ir are (row, head) with heads fastest; a run of items of one row and one KV group is one pass
// (a chunk edge inside a group leaves two shorter passes). A pass takes at most GGML_FA_GQA_PACK_MAX heads: a larger
// group (MLA's single KV head under up to 128 query heads) is walked in several passes, an MHA model's (rk2 == 1) one
// head at a time. The caller guarantees: a page table, no ALiBi (max_bias == 0), one mask for all heads
// (mask->ne[2] == 1), K and V broadcast alike (rk2 == rv2, rk3 == rv3).
#define GGML_FA_GQA_PACK_MAX 16

// the heads of one pass for a GQA ratio: the whole group up to GGML_FA_GQA_PACK_MAX, else its largest
// divisor that fits, so that chunks and the plan's items of whole passes tile every group exactly
int64_t ggml_fa_pass_heads(int64_t rk2) {
    for (int64_t p = std::min<int64_t>(rk2, GGML_FA_GQA_PACK_MAX); p > 1; --p) {
        if (rk2 % p == 0) {
            return p;
        }
    }
    return 1;
}

void ggml_compute_forward_flash_attn_ext_f16_gqa_packed(
        ggml_tensor * dst,
        int ir0, int ir1,
        int64_t ic_start, int64_t ic_end,
        float * partials, int64_t partial_stride,
        int64_t pg_start, int64_t pg_end) {

    const ggml_tensor * q     = dst->src[0];
    const ggml_tensor * k     = dst->src[1];
    const ggml_tensor * v     = dst->src[2];
    const ggml_tensor * mask  = dst->src[3];
    const ggml_tensor * sinks = dst->src[4];
    const ggml_tensor * pages = dst->src[5];
    const int64_t page_size   = ggml_get_op_params_i32(dst, 5);

    GGML_TENSOR_LOCALS(int64_t, neq, q,   ne)
    GGML_TENSOR_LOCALS(size_t,  nbq, q,   nb)
    GGML_TENSOR_LOCALS(int64_t, nek, k,   ne)
    GGML_TENSOR_LOCALS(size_t,  nbk, k,   nb)
    GGML_TENSOR_LOCALS(int64_t, nev, v,   ne)
    GGML_TENSOR_LOCALS(size_t,  nbv, v,   nb)
    GGML_TENSOR_LOCALS(int64_t, ne,  dst, ne)
    GGML_TENSOR_LOCALS(size_t,  nb,  dst, nb)

    const int64_t DK = nek0;
    const int64_t DV = nev0;

    const int64_t rk2 = neq2/nek2;
    const int64_t rk3 = neq3/nek3;

    GGML_ASSERT(pages && rk2 >= 1 && rk2 == neq2/nev2 && rk3 == neq3/nev3);
    GGML_ASSERT(!mask || mask->ne[2] == 1);

    float scale         = 1.0f;
    float max_bias      = 0.0f;
    float logit_softcap = 0.0f;

    memcpy(&scale,         (float *) dst->op_params + 0, sizeof(float));
    memcpy(&max_bias,      (float *) dst->op_params + 1, sizeof(float));
    memcpy(&logit_softcap, (float *) dst->op_params + 2, sizeof(float));
    GGML_ASSERT(max_bias == 0.0f);

    if (logit_softcap != 0) {
        scale /= logit_softcap;
    }

    ggml_type         const k_vec_dot_type = ggml_get_type_traits_cpu(k->type)->vec_dot_type;
    ggml_from_float_t const q_to_vec_dot   = ggml_get_type_traits_cpu(k_vec_dot_type)->from_float;
    ggml_vec_dot_t    const kq_vec_dot     = ggml_get_type_traits_cpu(k->type)->vec_dot;
    ggml_to_float_t   const v_to_float     = ggml_get_type_traits(v->type)->to_float;

    GGML_ASSERT((                            q_to_vec_dot) && "fattn: unsupported K-type");
    GGML_ASSERT((v->type == GGML_TYPE_F32 || v_to_float  ) && "fattn: unsupported V-type");

    const bool v_f16 = v->type == GGML_TYPE_F16;

    // the heads of the pass walk each page one after another (the first brings the page's K and V rows into L1, the
    // others read them there): measured faster on whole decodes, whose KV does not fit the caches, than every head at
    // each cell, and each head still meets the same cells in the same order, so no value changes. A quantized V
    // keeps the cell-by-cell order, which converts each V row once for all the heads.
    const bool heads_by_page = v_f16 || v->type == GGML_TYPE_F32;

    // per head of the group: Q in K's vec-dot type (DK floats of room, as llama.cpp's path), the VKQ accumulator
    // (F16 or F32, DV floats of room); one V row in F32 and one output row, shared
    static thread_local std::vector<float> scratch;
    const size_t q_stride = GGML_PAD(DK, CACHE_LINE_SIZE_F32);
    const size_t a_stride = GGML_PAD(DV, CACHE_LINE_SIZE_F32);
    scratch.resize(GGML_FA_GQA_PACK_MAX*(q_stride + a_stride) + 2*a_stride);
    float * Qs   = scratch.data();
    float * VKQs = Qs + GGML_FA_GQA_PACK_MAX*q_stride;
    float * V32  = VKQs + GGML_FA_GQA_PACK_MAX*a_stride;
    float * OUT  = V32 + a_stride;

    float M[GGML_FA_GQA_PACK_MAX];
    float S[GGML_FA_GQA_PACK_MAX];

    for (int ir = ir0; ir < ir1; ) {
        const int iq3 = ir/(neq2*neq1);
        const int irr = ir - iq3*neq2*neq1;
        const int iq2 = irr%neq2; // first head of this pass
        const int iq1 = irr/neq2;
        const int ng  = (int) std::min<int64_t>(std::min<int64_t>(rk2 - iq2%rk2, ir1 - ir), GGML_FA_GQA_PACK_MAX); // heads in this pass

        const int ik2 = iq2/rk2;
        const int ik3 = iq3/rk3;

        for (int j = 0; j < ng; ++j) {
            M[j] = -INFINITY;
            S[j] = 0.0f;
            if (v_f16) {
                memset(VKQs + j*a_stride, 0, DV*sizeof(ggml_fp16_t));
            } else {
                memset(VKQs + j*a_stride, 0, DV*sizeof(float));
            }
            const float * pq = (const float *) ((char *) q->data + (iq1*nbq1 + (iq2 + j)*nbq2 + iq3*nbq3));
            q_to_vec_dot(pq, Qs + j*q_stride, DK);
        }

        const ggml_fp16_t * mp = mask ? (ggml_fp16_t *)((char *) mask->data + iq1*mask->nb[1] + (iq3%mask->ne[3])*mask->nb[3]) : NULL;
        const ggml_fp16_t * mp_cur = mp; // none in a page whose mask is 0 throughout

        // one KV cell of the online softmax of the pass's heads [jh0, jh1)
        auto visit = [&](const int64_t ic, const int jh0, const int jh1) {
            const float mv = mp_cur ? GGML_CPU_FP16_TO_FP32(mp_cur[ic]) : 0.0f;
            if (mv == -INFINITY) {
                return;
            }
            const char * k_data = (const char *) k->data + (ic*nbk1 + ik2*nbk2 + ik3*nbk3);
            const char * v_data = (const char *) v->data + (ic*nbv1 + ik2*nbv2 + ik3*nbv3);
            bool v_converted = false;

            for (int j = jh0; j < jh1; ++j) {
                float s;
                kq_vec_dot(DK, &s, 0, k_data, 0, Qs + j*q_stride, 0, 1);
                s = s*scale;
                if (logit_softcap != 0.0f) {
                    s = logit_softcap*tanhf(s);
                }
                s += mv;

                const float Mold = M[j];
                float ms = 1.0f;
                float vs = 1.0f;

                if (v_f16) {
                    ggml_fp16_t * VKQ16 = (ggml_fp16_t *) (VKQs + j*a_stride);
                    if (s > M[j]) {
                        M[j] = s;
                        ms = expf(Mold - M[j]);
                        ggml_vec_scale_f16(DV, VKQ16, ms);
                    } else {
                        vs = expf(s - M[j]);
                    }
                    ggml_vec_mad_f16(DV, VKQ16, (const ggml_fp16_t *) v_data, vs);
                } else {
                    float * VKQ32 = VKQs + j*a_stride;
                    if (s > M[j]) {
                        M[j] = s;
                        ms = expf(Mold - M[j]);
                        ggml_vec_scale_f32(DV, VKQ32, ms);
                    } else {
                        vs = expf(s - M[j]);
                    }
                    if (v_to_float) {
                        if (!v_converted) {
                            v_to_float(v_data, V32, DV);
                            v_converted = true;
                        }
                        ggml_vec_mad_f32(DV, VKQ32, V32, vs);
                    } else {
                        ggml_vec_mad_f32(DV, VKQ32, (const float *) v_data, vs);
                    }
                }

                S[j] = S[j]*ms + vs;
            }
        };

        const fa_row prow = fa_row_of(pages, iq1);
        const int64_t j0 = std::max<int64_t>(pg_start, 0);
        const int64_t j1 = std::min<int64_t>(pg_end, prow.n);
        for (int64_t jp = j0; jp < j1; ++jp) {
            const int64_t c0 = std::max<int64_t>(fa_page(prow, jp)*page_size, ic_start);
            const int64_t c1 = std::min<int64_t>(fa_page_end(prow, jp, page_size), std::min<int64_t>(ic_end, nek1));
            mp_cur = fa_page_unmasked(prow, jp) ? nullptr : mp;
            if (heads_by_page) {
                for (int j = 0; j < ng; ++j) {
                    for (int64_t ic = c0; ic < c1; ++ic) {
                        visit(ic, j, j + 1);
                    }
                }
            } else {
                for (int64_t ic = c0; ic < c1; ++ic) {
                    visit(ic, 0, ng);
                }
            }
        }

        for (int j = 0; j < ng; ++j) {
            const int h = iq2 + j;
            float * acc = VKQs + j*a_stride;
            if (v_f16) {
                const ggml_fp16_t * VKQ16 = (const ggml_fp16_t *) acc;
                for (int64_t d = 0; d < DV; ++d) {
                    OUT[d] = GGML_CPU_FP16_TO_FP32(VKQ16[d]);
                }
            } else {
                memcpy(OUT, acc, DV*sizeof(float));
            }

            float Mh = M[j];
            float Sh = S[j];

            // sinks - apply only on the first kv-chunk
            if (sinks && ic_start == 0 && pg_start == 0) {
                const float s = ((float *)((char *) sinks->data))[h];
                float ms = 1.0f;
                float vs = 1.0f;
                if (s > Mh) {
                    ms = expf(Mh - s);
                    Mh = s;
                    ggml_vec_scale_f32(DV, OUT, ms);
                } else {
                    vs = expf(s - Mh);
                }
                Sh = Sh*ms + vs;
            }

            if (partials) {
                float * partial = partials + (ir - ir0 + j) * partial_stride;
                partial[0] = Mh;
                partial[1] = Sh;
                memcpy(partial + 2, OUT, DV * sizeof(float));
            } else {
                const float S_inv = Sh == 0.0f ? 0.0f : 1.0f/Sh;
                ggml_vec_scale_f32(DV, OUT, S_inv);
                // permute(0, 2, 1, 3)
                memcpy((char *) dst->data + (iq3*ne2*ne1 + h + iq1*ne1)*nb1, OUT, nb1);
            }
        }

        ir += ng;
    }
}

// Whether the paged per-row path takes the heads of a KV group in passes (see above): every GQA ratio,
// MHA's 1 and MLA's single KV head included
bool ggml_fa_gqa_packs(const ggml_tensor * dst) {
    const ggml_tensor * q    = dst->src[0];
    const ggml_tensor * k    = dst->src[1];
    const ggml_tensor * v    = dst->src[2];
    const ggml_tensor * mask = dst->src[3];
    float max_bias = 0.0f;
    memcpy(&max_bias, (const float *) dst->op_params + 1, sizeof(float));
    const int64_t rk2 = q->ne[2]/k->ne[2];
    return dst->src[5] != nullptr && rk2 >= 1 && rk2 == q->ne[2]/v->ne[2] &&
           k->ne[3] == v->ne[3] && max_bias == 0.0f && (!mask || mask->ne[2] == 1);
}

// The paged per-row path planned per batch (split-KV for several rows). Work items are (row, pass) passes
// of ggml_compute_forward_flash_attn_ext_f16_gqa_packed (a pass: ggml_fa_pass_heads query heads of one KV group, the
// whole group for GQA ratios up to 16), each as long as the row's page list; a ubatch that
// decodes one long sequence beside short ones would leave threads idle while others walk the long rows. A pass longer
// than half a thread's share of all pages is cut into pieces of consecutive pages (at least GGML_FA_PLAN_MIN_PAGES),
// each writing its heads' partial (M, S, VKQ) to the work buffer; after a barrier the pieces are combined per head as
// the one-row split-KV path combines its chunks. Items go out longest first through the threadpool's chunk counter.
// Passes that are not cut compute exactly as before; a cut pass sums its cells in another order (as split-KV does).
// The plan runs whenever the packed path has several rows, cut or not: whole passes handed out longest
// first balance rows of unequal lengths that llama.cpp's chunks (a whole row each, with MLA's 128 heads) leave on one
// thread, and give the same values.
#define GGML_FA_PLAN_MIN_PAGES 4

// the plan for a paged, GQA-packed per-row op on nth threads with a work buffer of cap_floats floats; false for one
// thread or one row, or when the partials of the cut passes would not fit: then the usual chunks run
bool ggml_fa_plan(const ggml_tensor * dst, int nth, size_t cap_floats,
        std::vector<ggml_fa_plan_item> & items, std::vector<ggml_fa_plan_cut> & cuts) {
    const ggml_tensor * q     = dst->src[0];
    const ggml_tensor * k     = dst->src[1];
    const ggml_tensor * v     = dst->src[2];
    const ggml_tensor * pages = dst->src[5];

    items.clear();
    cuts.clear();
    if (nth < 2 || q->ne[3] != 1 || q->ne[1] < 2) {
        return false;
    }
    const int64_t n_rows   = q->ne[1];
    const int64_t P        = ggml_fa_pass_heads(q->ne[2]/k->ne[2]);
    const int64_t n_groups = q->ne[2]/P;
    const int64_t DV       = v->ne[0];

    auto row_pages = [&](int64_t r) { return (int64_t) fa_row_of(pages, r).n; };

    int64_t total = 0;
    for (int64_t r = 0; r < n_rows; ++r) {
        total += row_pages(r)*n_groups;
    }
    const int64_t limit = std::max<int64_t>((total + 2*nth - 1)/(2*nth), GGML_FA_PLAN_MIN_PAGES);

    int32_t slot = 0;
    for (int64_t r = 0; r < n_rows; ++r) {
        const int64_t n = row_pages(r);
        if (n*n_groups <= limit) {
            // the row's passes on one thread, one after another, when together they are no longer than a pass may be:
            // a cell's K and V rows of the other KV groups sit beside the ones the first pass read (MLA's passes read
            // the same ones), and are still in that thread's cache
            items.push_back({ (int32_t) r, -1, 0, (int32_t) n, -1 });
            continue;
        }
        for (int64_t g = 0; g < n_groups; ++g) {
            if (n <= limit) {
                items.push_back({ (int32_t) r, (int32_t) g, 0, (int32_t) n, -1 });
                continue;
            }
            const int64_t pieces = (n + limit - 1)/limit;
            cuts.push_back({ (int32_t) r, (int32_t) g, slot, (int32_t) pieces });
            for (int64_t p = 0; p < pieces; ++p) {
                items.push_back({ (int32_t) r, (int32_t) g, (int32_t) (p*n/pieces), (int32_t) ((p + 1)*n/pieces), slot++ });
            }
        }
    }
    if ((size_t) slot*P*(2 + DV) > cap_floats) {
        return false;
    }
    auto weight = [n_groups](const ggml_fa_plan_item & it) { return (it.pg1 - it.pg0)*(it.group < 0 ? n_groups : 1); };
    std::stable_sort(items.begin(), items.end(), [&weight](const ggml_fa_plan_item & a, const ggml_fa_plan_item & b) {
        return weight(a) > weight(b);
    });
    return true;
}

void ggml_compute_forward_flash_attn_ext_planned(
        const ggml_compute_params * params,
        ggml_tensor * dst,
        const std::vector<ggml_fa_plan_item> & items,
        const std::vector<ggml_fa_plan_cut> & cuts) {
    const ggml_tensor * q = dst->src[0];
    const ggml_tensor * k = dst->src[1];
    const ggml_tensor * v = dst->src[2];

    const int64_t neq2 = q->ne[2];
    const int64_t P    = ggml_fa_pass_heads(neq2/k->ne[2]);
    const int64_t nek1 = k->ne[1];
    const int64_t DV   = v->ne[0];
    const int64_t psz  = 2 + DV; // a head's partial: M, S, VKQ[DV]

    float * partials = (float *) params->wdata;

    // the threadpool's chunk counter was set to nth (and a barrier passed) by the caller
    for (int t = params->ith; t < (int) items.size(); t = ggml_threadpool_chunk_add(params->threadpool, 1)) {
        const ggml_fa_plan_item & it = items[t];
        const int64_t g0 = it.group < 0 ? 0         : it.group;
        const int64_t g1 = it.group < 0 ? neq2/P    : it.group + 1;
        for (int64_t g = g0; g < g1; ++g) {
            const int ir0 = (int) (it.row*neq2 + g*P);
            ggml_compute_forward_flash_attn_ext_f16_gqa_packed(dst, ir0, ir0 + (int) P, 0, nek1,
                    it.slot < 0 ? nullptr : partials + (int64_t) it.slot*P*psz, psz, it.pg0, it.pg1);
        }
    }

    ggml_barrier(params->threadpool);

    static thread_local std::vector<float> acc;
    acc.resize(DV);
    for (size_t c = params->ith; c < cuts.size(); c += params->nth) {
        const ggml_fa_plan_cut & cut = cuts[c];
        for (int64_t j = 0; j < P; ++j) {
            float M = -INFINITY;
            float S = 0.0f;
            std::fill(acc.begin(), acc.end(), 0.0f);
            for (int32_t p = 0; p < cut.n; ++p) {
                ggml_fa_merge_partial(M, S, acc.data(), partials + ((int64_t) (cut.slot0 + p)*P + j)*psz, DV);
            }
            if (S != 0.0f) {
                ggml_vec_scale_f32(DV, acc.data(), 1.0f/S);
            }
            // permute(0, 2, 1, 3), as the per-row path writes
            const int64_t h = cut.group*P + j;
            memcpy((char *) dst->data + (h + cut.row*dst->ne[1])*dst->nb[1], acc.data(), dst->nb[1]);
        }
    }
}
