// Arbor's C ABI over llama.cpp's speculative decoding: see arbor-spec.h.

#include "arbor-spec.h"

#include "common.h"
#include "speculative.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <sstream>
#include <string>
#include <vector>

struct arbor_spec {
    common_params_speculative params;
    common_speculative_ptr    spec;

    std::vector<llama_tokens> history; // per lane: the tokens whose KV the target holds
    std::vector<llama_tokens> drafts;  // per lane: the last draft (common_speculative_draft writes it)

    // draft-simple: the draft model's context, and per lane the tokens its sequence there holds
    llama_context *           ctx_dft = nullptr;
    std::vector<llama_tokens> dft_kv;
    common_batch              dft_batch;
};

static void set_error(char ** error, const std::string & message) {
    if (error) {
        *error = strdup(message.c_str());
    }
}

static std::vector<std::string> split_names(const char * types) {
    std::vector<std::string> names;
    std::stringstream ss(types ? types : "");
    std::string name;
    while (std::getline(ss, name, ',')) {
        name.erase(0, name.find_first_not_of(" \t"));
        name.erase(name.find_last_not_of(" \t") + 1);
        if (!name.empty()) {
            names.push_back(name);
        }
    }
    return names;
}

// the ranges llama-server's argument parser enforces (common/arg.cpp), checked again here for direct callers
static std::string check_ranges(const arbor_spec_params & p) {
    auto in = [](int32_t v, int32_t lo, int32_t hi) { return v >= lo && v <= hi; };
    if (p.n_lanes < 1) return "n_lanes must be at least 1";
    if (p.draft_n_max < 0) return "--spec-draft-n-max must be at least 0";
    if (p.draft_n_min < 0) return "--spec-draft-n-min must be at least 0";
    if (!(p.draft_p_min >= 0.0f && p.draft_p_min <= 1.0f)) return "--spec-draft-p-min must be between 0 and 1";
    const struct { const char * name; int32_t n, m, hits; } maps[] = {
        { "ngram-simple",  p.ngram_simple_size_n,  p.ngram_simple_size_m,  p.ngram_simple_min_hits  },
        { "ngram-map-k",   p.ngram_map_k_size_n,   p.ngram_map_k_size_m,   p.ngram_map_k_min_hits   },
        { "ngram-map-k4v", p.ngram_map_k4v_size_n, p.ngram_map_k4v_size_m, p.ngram_map_k4v_min_hits },
    };
    for (const auto & m : maps) {
        if (!in(m.n, 1, 1024) || !in(m.m, 1, 1024) || !in(m.hits, 1, 1024)) {
            return std::string("--spec-") + m.name + "-size-n, -size-m and -min-hits must be between 1 and 1024";
        }
    }
    if (!in(p.ngram_mod_n_match, 1, 1024)) return "--spec-ngram-mod-n-match must be between 1 and 1024";
    if (!in(p.ngram_mod_n_min, 0, 1024) || !in(p.ngram_mod_n_max, 0, 1024)) {
        return "--spec-ngram-mod-n-min and -n-max must be between 0 and 1024";
    }
    return "";
}

// The draft context's sequence `lane` holds exactly the lane's history: keep the longest common prefix, compute
// the rest (no outputs). A sequence that cannot be cut back (a recurrent draft model) is computed afresh.
static bool sync_draft_kv(arbor_spec & s, int32_t lane, std::string & err) {
    auto & kv = s.dft_kv[lane];
    const auto & h = s.history[lane];
    llama_memory_t mem = llama_get_memory(s.ctx_dft);

    size_t keep = 0;
    while (keep < kv.size() && keep < h.size() && kv[keep] == h[keep]) {
        keep++;
    }
    if (keep < kv.size()) {
        if (!llama_memory_seq_rm(mem, lane, (llama_pos) keep, -1)) {
            llama_memory_seq_rm(mem, lane, -1, -1);
            keep = 0;
        }
        kv.resize(keep);
    }
    const size_t n_batch = std::max<uint32_t>(1, llama_n_batch(s.ctx_dft));
    for (size_t i = keep; i < h.size(); i += n_batch) {
        s.dft_batch.clear();
        for (size_t j = i; j < std::min(h.size(), i + n_batch); ++j) {
            s.dft_batch.add(h[j], (llama_pos) j, lane, false);
        }
        const int32_t ret = llama_process(s.ctx_dft, LLAMA_PROCESS_TYPE_DECODE, s.dft_batch.get());
        if (ret != 0) {
            llama_memory_seq_rm(mem, lane, -1, -1);
            kv.clear();
            err = "the draft model could not compute lane " + std::to_string(lane) + "'s history (llama_process " +
                  std::to_string(ret) + ")";
            return false;
        }
        kv.insert(kv.end(), h.begin() + i, h.begin() + std::min(h.size(), i + n_batch));
    }
    return true;
}

extern "C" {

int arbor_spec_abi_version(void) {
    return ARBOR_SPEC_ABI_VERSION;
}

void arbor_spec_default_params(arbor_spec_params * out) {
    const common_params_speculative d;
    *out = {};
    out->types       = "none";
    out->n_lanes     = 1;
    out->draft_n_max = d.draft.n_max;
    out->draft_n_min = d.draft.n_min;
    out->draft_p_min = d.draft.p_min;
    out->ngram_simple_size_n   = d.ngram_simple.size_n;
    out->ngram_simple_size_m   = d.ngram_simple.size_m;
    out->ngram_simple_min_hits = d.ngram_simple.min_hits;
    out->ngram_map_k_size_n    = d.ngram_map_k.size_n;
    out->ngram_map_k_size_m    = d.ngram_map_k.size_m;
    out->ngram_map_k_min_hits  = d.ngram_map_k.min_hits;
    out->ngram_map_k4v_size_n   = d.ngram_map_k4v.size_n;
    out->ngram_map_k4v_size_m   = d.ngram_map_k4v.size_m;
    out->ngram_map_k4v_min_hits = d.ngram_map_k4v.min_hits;
    out->ngram_mod_n_match = d.ngram_mod.n_match;
    out->ngram_mod_n_min   = d.ngram_mod.n_min;
    out->ngram_mod_n_max   = d.ngram_mod.n_max;
}

const char * arbor_spec_all_types(void) {
    return common_speculative_all_types_str();
}

arbor_spec * arbor_spec_init(const arbor_spec_params * p, char ** error) {
    try {
        if (!p) {
            set_error(error, "no parameters");
            return nullptr;
        }
        const std::string bad = check_ranges(*p);
        if (!bad.empty()) {
            set_error(error, bad);
            return nullptr;
        }
        // llama.cpp's own names (an unknown one throws "unknown speculative type: X")
        const std::vector<common_speculative_type> types = common_speculative_types_from_names(split_names(p->types));
        if (types.empty() || (types.size() == 1 && types[0] == COMMON_SPECULATIVE_TYPE_NONE)) {
            return nullptr;
        }
        for (const auto type : types) {
            switch (type) {
                case COMMON_SPECULATIVE_TYPE_DRAFT_EAGLE3:
                case COMMON_SPECULATIVE_TYPE_DRAFT_MTP:
                case COMMON_SPECULATIVE_TYPE_DRAFT_DFLASH:
                case COMMON_SPECULATIVE_TYPE_DRAFT_DSPARK:
                    set_error(error, common_speculative_type_to_str(type) + " drafts from the target's hidden states, "
                              "which Arbor's engine does not hand to a drafter yet: use draft-simple or an n-gram type");
                    return nullptr;
                case COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE:
                    if (!p->ctx_dft || !p->ctx_tgt) {
                        set_error(error, "draft-simple needs a draft model (--spec-draft-model)");
                        return nullptr;
                    }
                    break;
                default:
                    break;
            }
        }

        auto s = std::make_unique<arbor_spec>();
        auto & c = s->params;
        c.types = types;
        c.draft.n_max   = p->draft_n_max;
        c.draft.n_min   = p->draft_n_min;
        c.draft.p_min   = p->draft_p_min;
        c.draft.ctx_tgt = p->ctx_tgt;
        c.draft.ctx_dft = p->ctx_dft;
        c.ngram_simple  = { (uint16_t) p->ngram_simple_size_n,  (uint16_t) p->ngram_simple_size_m,  (uint16_t) p->ngram_simple_min_hits  };
        c.ngram_map_k   = { (uint16_t) p->ngram_map_k_size_n,   (uint16_t) p->ngram_map_k_size_m,   (uint16_t) p->ngram_map_k_min_hits   };
        c.ngram_map_k4v = { (uint16_t) p->ngram_map_k4v_size_n, (uint16_t) p->ngram_map_k4v_size_m, (uint16_t) p->ngram_map_k4v_min_hits };
        c.ngram_mod.n_match = p->ngram_mod_n_match;
        c.ngram_mod.n_min   = p->ngram_mod_n_min;
        c.ngram_mod.n_max   = p->ngram_mod_n_max;
        c.ngram_cache.lookup_cache_static  = p->ngram_cache_static  ? p->ngram_cache_static  : "";
        c.ngram_cache.lookup_cache_dynamic = p->ngram_cache_dynamic ? p->ngram_cache_dynamic : "";

        s->spec.reset(common_speculative_init(c, (uint32_t) p->n_lanes));
        if (!s->spec) {
            set_error(error, "llama.cpp made no drafter of the types given");
            return nullptr;
        }
        s->history.resize(p->n_lanes);
        s->drafts.resize(p->n_lanes);
        for (const auto type : types) {
            if (type == COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE) {
                s->ctx_dft = p->ctx_dft;
                s->dft_kv.resize(p->n_lanes);
                s->dft_batch = common_batch(p->ctx_dft);
            }
        }
        return s.release();
    } catch (const std::exception & e) {
        set_error(error, e.what());
        return nullptr;
    }
}

void arbor_spec_free(arbor_spec * spec) {
    delete spec;
}

int32_t arbor_spec_n_max(const arbor_spec * spec) {
    return spec && spec->spec ? common_speculative_n_max(spec->spec.get()) : 0;
}

static bool lane_ok(const arbor_spec * spec, int32_t lane) {
    return spec && lane >= 0 && lane < (int32_t) spec->history.size();
}

int32_t arbor_spec_begin(arbor_spec * spec, int32_t lane, const llama_token * tokens, int32_t n) {
    if (!lane_ok(spec, lane) || n < 0) {
        return -1;
    }
    spec->history[lane].assign(tokens, tokens + n);
    spec->drafts[lane].clear();
    common_speculative_begin(spec->spec.get(), lane, spec->history[lane]);
    return 0;
}

int32_t arbor_spec_push(arbor_spec * spec, int32_t lane, const llama_token * tokens, int32_t n) {
    if (!lane_ok(spec, lane) || n < 0) {
        return -1;
    }
    spec->history[lane].insert(spec->history[lane].end(), tokens, tokens + n);
    return 0;
}

int32_t arbor_spec_draft(arbor_spec * spec, int32_t n, const int32_t * lanes, const llama_token * id_last,
        const llama_pos * pos0, const int32_t * n_max, llama_token * out, int32_t out_stride, int32_t * out_n,
        char ** error) {
    try {
        for (int32_t i = 0; i < n; ++i) {
            if (!lane_ok(spec, lanes[i])) {
                set_error(error, "lane " + std::to_string(lanes[i]) + " out of range");
                return -1;
            }
        }
        if (spec->ctx_dft) {
            for (int32_t i = 0; i < n; ++i) {
                std::string err;
                if (!sync_draft_kv(*spec, lanes[i], err)) {
                    set_error(error, err);
                    return -1;
                }
            }
        }
        for (int32_t i = 0; i < n; ++i) {
            const int32_t lane = lanes[i];
            spec->drafts[lane].clear();
            common_speculative_get_draft_params(spec->spec.get(), lane) = {
                /* .drafting = */ true,
                /* .n_max    = */ n_max[i] > 0 ? n_max[i] : -1,
                /* .pos0     = */ pos0[i],
                /* .id_last  = */ id_last[i],
                /* .prompt   = */ &spec->history[lane],
                /* .result   = */ &spec->drafts[lane],
            };
        }
        common_speculative_draft(spec->spec.get());
        for (int32_t i = 0; i < n; ++i) {
            const int32_t lane = lanes[i];
            auto & draft = spec->drafts[lane];
            if (n_max[i] > 0 && (int32_t) draft.size() > n_max[i]) {
                draft.resize(n_max[i]);
            }
            const int32_t m = std::min<int32_t>((int32_t) draft.size(), out_stride);
            std::copy(draft.begin(), draft.begin() + m, out + (size_t) i*out_stride);
            out_n[i] = m;
            if (spec->ctx_dft) {
                // the draft model computed id_last and its draft after the history: drop them, they are not history
                llama_memory_seq_rm(llama_get_memory(spec->ctx_dft), lane, (llama_pos) spec->dft_kv[lane].size(), -1);
            }
        }
        return 0;
    } catch (const std::exception & e) {
        set_error(error, e.what());
        return -1;
    }
}

int32_t arbor_spec_accept(arbor_spec * spec, int32_t lane, int32_t n_accepted) {
    if (!lane_ok(spec, lane) || n_accepted < 0) {
        return -1;
    }
    common_speculative_accept(spec->spec.get(), lane, (uint16_t) std::min<int32_t>(n_accepted, UINT16_MAX));
    return 0;
}

void arbor_spec_string_free(char * s) {
    free(s);
}

} // extern "C"
