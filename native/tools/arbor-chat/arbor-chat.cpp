// Arbor's C ABI over common/chat (see arbor-chat.h). Each entry point mirrors a step of
// llama-server's chat path (tools/server/server-common.cpp: oaicompat_chat_params_parse;
// server-schema.cpp: grammar triggers and preserved tokens; server-task.cpp: update_chat_msg) so
// that a request renders, is constrained and is parsed exactly as llama-server would.

#include "arbor-chat.h"

#include "chat.h"
#include "common.h"
#include "json.h"
#include "peg-parser.h"
#include "reasoning-budget.h"

#include <cctype>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

struct arbor_chat_templates {
    common_chat_templates_ptr tmpls;
    const llama_vocab *       vocab;
};

struct arbor_chat_parser {
    common_chat_parser_params params;
};

static char * dup_string(const std::string & s) {
    char * out = static_cast<char *>(std::malloc(s.size() + 1));
    if (out) {
        std::memcpy(out, s.c_str(), s.size() + 1);
    }
    return out;
}

static void set_error(char ** error, const std::string & message) {
    if (error) {
        *error = dup_string(message);
    }
}

// Token ids of a string that is exactly one token (special tokens parsed), else none.
static bool single_token(const llama_vocab * vocab, const std::string & text, llama_token & out) {
    if (!vocab) {
        return false;
    }
    auto ids = common_tokenize(vocab, text, /* add_special= */ false, /* parse_special= */ true);
    if (ids.size() != 1) {
        return false;
    }
    out = ids[0];
    return true;
}

extern "C" {

int arbor_chat_abi_version(void) {
    return ARBOR_CHAT_ABI_VERSION;
}

arbor_chat_templates * arbor_chat_templates_init(const llama_model * model, const char * template_override,
                                                 char ** error) {
    try {
        if (!model && !(template_override && *template_override)) {
            set_error(error, "a chat template needs a model or a template's source");
            return nullptr;
        }
        auto * out  = new arbor_chat_templates();
        out->tmpls  = common_chat_templates_init(model, template_override ? template_override : "");
        out->vocab  = model ? llama_model_get_vocab(model) : nullptr;
        if (!out->tmpls) {
            delete out;
            set_error(error, "llama.cpp could not load the chat template");
            return nullptr;
        }
        return out;
    } catch (const std::exception & e) {
        set_error(error, e.what());
        return nullptr;
    }
}

void arbor_chat_templates_free(arbor_chat_templates * tmpls) {
    delete tmpls;
}

char * arbor_chat_templates_info(const arbor_chat_templates * tmpls) {
    try {
        common_json caps = common_json::object();
        for (const auto & [name, value] : common_chat_templates_get_caps(tmpls->tmpls.get())) {
            caps[name] = value;
        }
        common_json out = common_json::object();
        out["source"]            = common_chat_templates_source(tmpls->tmpls.get());
        out["tool_use_source"]   = common_chat_templates_source(tmpls->tmpls.get(), "tool_use");
        out["caps"]              = caps;
        out["supports_thinking"] = common_chat_templates_support_enable_thinking(tmpls->tmpls.get());
        out["explicit"]          = common_chat_templates_was_explicit(tmpls->tmpls.get());
        return dup_string(out.dump_safe());
    } catch (const std::exception & e) {
        return nullptr;
    }
}

char * arbor_chat_apply(const arbor_chat_templates * tmpls, const char * request_json, char ** error) {
    try {
        const common_json body = common_json::parse(request_json);
        const auto        caps = common_chat_templates_get_caps(tmpls->tmpls.get());

        common_chat_templates_inputs inputs;
        inputs.messages = common_chat_msgs_parse_oaicompat(body.at("messages"));
        if (body.contains("tools") && !body.at("tools").is_null()) {
            inputs.tools = common_chat_tools_parse_oaicompat(body.at("tools"));
        }
        inputs.tool_choice = common_chat_tool_choice_parse_oaicompat(body.value("tool_choice", std::string("auto")));
        const auto parallel = caps.find("supports_parallel_tool_calls");
        inputs.parallel_tool_calls =
            body.value("parallel_tool_calls", parallel != caps.end() && parallel->second);
        inputs.add_generation_prompt = body.value("add_generation_prompt", true);
        inputs.json_schema           = body.value("json_schema", std::string());
        inputs.grammar               = body.value("grammar", std::string());
        inputs.reasoning_format      = common_reasoning_format_from_name(body.value("reasoning_format", std::string("auto")));
        inputs.enable_thinking       = body.value("enable_thinking", true);
        if (body.contains("chat_template_kwargs")) {
            for (const auto & item : body.at("chat_template_kwargs").items()) {
                inputs.chat_template_kwargs[item.key()] = item.value().dump();
            }
        }

        const common_chat_params params = common_chat_templates_apply(tmpls->tmpls.get(), inputs);

        // Grammar triggers as common/sampling.cpp hands them to the lazy grammar sampler; a trigger
        // word that is one token becomes a token trigger, as llama-server's request parser does.
        common_json patterns = common_json::array();
        common_json trigger_tokens = common_json::array();
        for (const auto & trigger : params.grammar_triggers) {
            llama_token token = LLAMA_TOKEN_NULL;
            switch (trigger.type) {
                case COMMON_GRAMMAR_TRIGGER_TYPE_WORD:
                    if (single_token(tmpls->vocab, trigger.value, token)) {
                        trigger_tokens.push_back(token);
                    } else {
                        patterns.push_back(regex_escape(trigger.value));
                    }
                    break;
                case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN:
                    patterns.push_back(trigger.value);
                    break;
                case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN_FULL: {
                    const auto & p = trigger.value;
                    std::string anchored = "^$";
                    if (!p.empty()) {
                        anchored = (p.front() != '^' ? "^" : "") + p + (p.back() != '$' ? "$" : "");
                    }
                    patterns.push_back(anchored);
                    break;
                }
                case COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN:
                    trigger_tokens.push_back(trigger.token);
                    break;
            }
        }
        common_json preserved = common_json::array();
        for (const auto & text : params.preserved_tokens) {
            llama_token token = LLAMA_TOKEN_NULL;
            if (single_token(tmpls->vocab, text, token)) {
                preserved.push_back(token);
            }
        }
        // A chat grammar that is not lazy starts with the generation prompt (e.g. an opened
        // <think>): it is fed those tokens first, as common_sampler_init does.
        // The generation prompt's tokens, as common_sampler_init computes them (a leading space
        // some tokenizers add before a special token is not the prompt's).
        common_json gen_tokens = common_json::array();
        if (tmpls->vocab && !params.generation_prompt.empty()) {
            auto ids = common_tokenize(tmpls->vocab, params.generation_prompt, false, true);
            for (size_t i = 0; i < ids.size(); i++) {
                const std::string piece = common_token_to_piece(tmpls->vocab, ids[i], true);
                if (i == 0 && !piece.empty() && std::isspace(static_cast<unsigned char>(piece[0])) &&
                    !std::isspace(static_cast<unsigned char>(params.generation_prompt[0]))) {
                    continue;
                }
                gen_tokens.push_back(ids[i]);
            }
        }
        const bool prefill_grammar = !params.grammar.empty() && !params.grammar_lazy && inputs.grammar.empty();
        common_json prefill = prefill_grammar ? gen_tokens : common_json::array();
        common_json stops = common_json::array();
        for (const auto & s : params.additional_stops) {
            stops.push_back(s);
        }
        common_json end_tags = common_json::array();
        for (const auto & s : params.thinking_end_tags) {
            end_tags.push_back(s);
        }

        common_json out = common_json::object();
        out["prompt"]                 = params.prompt;
        out["format"]                 = static_cast<int>(params.format);
        out["format_name"]            = common_chat_format_name(params.format);
        out["grammar"]                = params.grammar;
        out["grammar_lazy"]           = params.grammar_lazy;
        out["trigger_patterns"]       = patterns;
        out["trigger_tokens"]         = trigger_tokens;
        out["preserved_tokens"]       = preserved;
        out["grammar_prefill_tokens"] = prefill;
        out["generation_prompt_tokens"] = gen_tokens;
        out["generation_prompt"]      = params.generation_prompt;
        out["additional_stops"]       = stops;
        out["parser"]                 = params.parser;
        out["supports_thinking"]      = params.supports_thinking;
        out["thinking_start_tag"]     = params.thinking_start_tag;
        out["thinking_end_tags"]      = end_tags;
        return dup_string(out.dump_safe());
    } catch (const std::exception & e) {
        set_error(error, e.what());
        return nullptr;
    }
}

arbor_chat_parser * arbor_chat_parser_init(const char * params_json, char ** error) {
    try {
        const common_json body = common_json::parse(params_json);
        auto * out = new arbor_chat_parser();
        out->params.format            = static_cast<common_chat_format>(body.value("format", 0));
        out->params.reasoning_format  = common_reasoning_format_from_name(body.value("reasoning_format", std::string("auto")));
        out->params.generation_prompt = body.value("generation_prompt", std::string());
        out->params.parse_tool_calls  = body.value("parse_tool_calls", true);
        const std::string parser      = body.value("parser", std::string());
        if (!parser.empty()) {
            try {
                out->params.parser.load(parser);
            } catch (...) {
                delete out;
                throw;
            }
        }
        return out;
    } catch (const std::exception & e) {
        set_error(error, e.what());
        return nullptr;
    }
}

void arbor_chat_parser_free(arbor_chat_parser * parser) {
    delete parser;
}

char * arbor_chat_parse(arbor_chat_parser * parser, const char * text, bool is_partial, char ** error) {
    try {
        const common_chat_msg msg = common_chat_parse(text, is_partial, parser->params);
        common_json out = common_json::object();
        out["role"]              = msg.role.empty() ? std::string("assistant") : msg.role;
        out["content"]           = msg.content;
        out["reasoning_content"] = msg.reasoning_content;
        common_json calls = common_json::array();
        for (const auto & call : msg.tool_calls) {
            common_json fn = common_json::object();
            fn["name"]      = call.name;
            fn["arguments"] = call.arguments;
            common_json c = common_json::object();
            c["type"]     = "function";
            c["id"]       = call.id;
            c["function"] = fn;
            calls.push_back(c);
        }
        out["tool_calls"] = calls;
        return dup_string(out.dump_safe());
    } catch (const std::exception & e) {
        set_error(error, e.what());
        return nullptr;
    }
}

llama_sampler * arbor_chat_reasoning_budget_init(const llama_vocab * vocab, const char * params_json,
                                                 char ** error) {
    try {
        const common_json body = common_json::parse(params_json);
        const std::string start = body.value("start_tag", std::string());
        if (start.empty()) {
            throw std::invalid_argument("a reasoning budget needs the template's start tag");
        }
        std::vector<llama_tokens> ends;
        for (const auto & tag : body.at("end_tags")) {
            const std::string text = tag;
            if (!text.empty()) {
                ends.push_back(common_tokenize(vocab, text, false, true));
            }
        }
        if (ends.empty()) {
            throw std::invalid_argument("a reasoning budget needs the template's end tags");
        }
        // what the budget forces: the message, then the first end tag (llama-server's rule)
        llama_tokens forced = ends.front();
        const std::string message = body.value("message", std::string());
        if (!message.empty()) {
            const auto ids = common_tokenize(vocab, message, false, true);
            forced.insert(forced.begin(), ids.begin(), ids.end());
        }
        const int budget = body.value("budget", -1);
        llama_sampler * smpl = common_reasoning_budget_init(vocab, {common_tokenize(vocab, start, false, true)}, ends,
                                                            forced, budget < 0 ? INT_MAX : budget);
        if (body.contains("prefill")) {
            for (const auto & token : body.at("prefill")) {
                llama_sampler_accept(smpl, token.get<int>());
            }
        }
        return smpl;
    } catch (const std::exception & e) {
        set_error(error, e.what());
        return nullptr;
    }
}

int arbor_chat_reasoning_budget_state(const llama_sampler * smpl) {
    return static_cast<int>(common_reasoning_budget_get_state(smpl));
}

int arbor_chat_reasoning_budget_end_match(const llama_sampler * smpl, llama_token * out, int capacity) {
    const llama_tokens * match = common_reasoning_budget_get_end_match(smpl);
    if (!match) {
        return 0;
    }
    for (int i = 0; i < capacity && i < static_cast<int>(match->size()); i++) {
        out[i] = (*match)[i];
    }
    return static_cast<int>(match->size());
}

void arbor_chat_string_free(char * s) {
    std::free(s);
}

}  // extern "C"
