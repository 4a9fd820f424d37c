// Arbor's C ABI over llama.cpp's speculative decoding (common/speculative.h): its drafters, driven by
// Arbor's engine.
//
// Arbor's server is Python over llama-cpp-python's ctypes bindings, and common/speculative is C++ with no C
// API. This library exposes what the engine needs of it, so every drafter llama-server offers (the n-gram
// drafters ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod, ngram-cache, and a draft model,
// draft-simple) drafts with llama.cpp's own code instead of a Python copy.
//
// Lanes. A drafter drafts for `n_lanes` sequences at once, lanes 0 .. n_lanes-1 (the engine's slots). Each lane
// keeps its sequence's history here: the tokens whose KV the target holds, in order. `arbor_spec_begin` starts a
// lane's history (a new request; the whole prompt), `arbor_spec_push` appends what the target decoded since, and
// `arbor_spec_draft` drafts the tokens after (history, id_last) for several lanes in one call, where id_last is
// the token the target sampled last and has not decoded yet (llama-server's id_last). After the target verified a
// lane's draft, `arbor_spec_accept` says how many of its tokens it accepted.
//
// draft-simple's draft model runs in `ctx_dft`, a context of its own with n_lanes sequences. Its KV follows each
// lane's history lazily: before a lane drafts, the draft context keeps the longest prefix its sequence shares with
// the history and computes the rest, so a lane reuses what its last request left there.
//
// No function throws across the ABI. A function that fails returns NULL or a negative number and, when `error`
// is given, sets *error to a message to free with arbor_spec_string_free.

#pragma once

#include "llama.h"

#include <stdbool.h>
#include <stdint.h>

#if defined(_WIN32)
#    define ARBOR_SPEC_API __declspec(dllexport)
#else
#    define ARBOR_SPEC_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define ARBOR_SPEC_ABI_VERSION 1

struct arbor_spec;

// llama-server's --spec-* flags, as numbers (arbor_spec_default_params: llama.cpp's own defaults)
struct arbor_spec_params {
    const char * types;     // comma-separated --spec-type names, e.g. "ngram-map-k" or "ngram-mod,draft-simple"
    int32_t      n_lanes;   // sequences drafting at once (lanes 0 .. n_lanes-1)

    // --spec-draft-n-max, --spec-draft-n-min, --spec-draft-p-min: draft-model types
    int32_t draft_n_max;
    int32_t draft_n_min;
    float   draft_p_min;
    struct llama_context * ctx_tgt;  // the target's context (draft-simple checks that the vocabularies match)
    struct llama_context * ctx_dft;  // the draft model's context, n_lanes sequences (draft-simple); else NULL

    // --spec-ngram-simple-*, --spec-ngram-map-k-*, --spec-ngram-map-k4v-*: size-n, size-m, min-hits
    int32_t ngram_simple_size_n,  ngram_simple_size_m,  ngram_simple_min_hits;
    int32_t ngram_map_k_size_n,   ngram_map_k_size_m,   ngram_map_k_min_hits;
    int32_t ngram_map_k4v_size_n, ngram_map_k4v_size_m, ngram_map_k4v_min_hits;

    // --spec-ngram-mod-n-match, --spec-ngram-mod-n-min, --spec-ngram-mod-n-max
    int32_t ngram_mod_n_match, ngram_mod_n_min, ngram_mod_n_max;

    // ngram-cache's static and dynamic lookup caches (files written by llama.cpp's lookup tools); NULL: none
    const char * ngram_cache_static;
    const char * ngram_cache_dynamic;
};

ARBOR_SPEC_API int arbor_spec_abi_version(void);

// llama.cpp's defaults for every field (types "none", n_lanes 1, no contexts)
ARBOR_SPEC_API void arbor_spec_default_params(struct arbor_spec_params * out);

// every type name the pinned llama.cpp knows, comma-separated (static; do not free)
ARBOR_SPEC_API const char * arbor_spec_all_types(void);

// A drafter; NULL + *error for an unknown type, a type that needs what is not given (a draft context), a draft
// model whose vocabulary is not the target's, or parameters llama.cpp refuses. Types "none" give NULL without an
// error: nothing to draft with.
ARBOR_SPEC_API struct arbor_spec * arbor_spec_init(const struct arbor_spec_params * params, char ** error);
ARBOR_SPEC_API void arbor_spec_free(struct arbor_spec * spec);

// the most tokens one draft may have (the largest of its types' limits)
ARBOR_SPEC_API int32_t arbor_spec_n_max(const struct arbor_spec * spec);

// Start lane `lane`'s history with `tokens` (a new request: its prompt, every token the target holds); -1 for a
// lane out of range.
ARBOR_SPEC_API int32_t arbor_spec_begin(struct arbor_spec * spec, int32_t lane, const llama_token * tokens, int32_t n);

// Append `tokens` to lane `lane`'s history (what the target decoded since); -1 for a lane out of range.
ARBOR_SPEC_API int32_t arbor_spec_push(struct arbor_spec * spec, int32_t lane, const llama_token * tokens, int32_t n);

// Draft for n lanes at once: lane lanes[i] continues its history with id_last[i] (at position pos0[i]) and gets
// at most n_max[i] tokens (0: the drafter's own limit), written to out[i*out_stride ...], their count to
// out_n[i] (0: no draft). Returns 0, or -1 (and *error) when a lane is out of range or drafting failed.
ARBOR_SPEC_API int32_t arbor_spec_draft(struct arbor_spec * spec, int32_t n, const int32_t * lanes,
        const llama_token * id_last, const llama_pos * pos0, const int32_t * n_max,
        llama_token * out, int32_t out_stride, int32_t * out_n, char ** error);

// The target accepted the first n_accepted tokens of lane `lane`'s last draft (the drafters learn from it).
ARBOR_SPEC_API int32_t arbor_spec_accept(struct arbor_spec * spec, int32_t lane, int32_t n_accepted);

ARBOR_SPEC_API void arbor_spec_string_free(char * s);

#ifdef __cplusplus
}
#endif
