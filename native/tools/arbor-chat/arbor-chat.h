// Arbor's C ABI over llama.cpp's chat layer (common/chat.h): JSON in, JSON out.
//
// Arbor's server is Python (llama-cpp-python's ctypes bindings); common/chat is C++ with no C API.
// This library exposes exactly what llama-server's chat path uses, so Arbor renders every template
// with llama.cpp's own Jinja engine and parses every family's reasoning and tool calls with
// llama.cpp's own parsers, instead of keeping a Python copy of either.
//
// Every function that returns char * returns a string allocated here: free it with
// arbor_chat_string_free. A function that fails returns NULL and, when `error` is given, sets
// *error to a message (free it the same way). No function throws across the ABI.

#pragma once

#include "llama.h"

#if defined(_WIN32)
#    define ARBOR_CHAT_API __declspec(dllexport)
#else
#    define ARBOR_CHAT_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define ARBOR_CHAT_ABI_VERSION 2

struct arbor_chat_templates;
struct arbor_chat_parser;

ARBOR_CHAT_API int arbor_chat_abi_version(void);

// The model's chat templates (the GGUF's default and tool_use variants), or `template_override`
// when it is non-NULL and non-empty (a template's source text). NULL + *error when llama.cpp
// cannot load it. `model` may be NULL with an override (no vocabulary: trigger words stay patterns,
// no preserved or prefill tokens).
ARBOR_CHAT_API struct arbor_chat_templates * arbor_chat_templates_init(
        const struct llama_model * model, const char * template_override, char ** error);
ARBOR_CHAT_API void arbor_chat_templates_free(struct arbor_chat_templates * tmpls);

// {"source": "...", "caps": {...}, "supports_thinking": bool, "explicit": bool}
ARBOR_CHAT_API char * arbor_chat_templates_info(const struct arbor_chat_templates * tmpls);

// Applies the template as llama-server's /v1/chat/completions does. Request (JSON object):
//   messages (OpenAI format, required), tools, tool_choice ("auto"|"required"|"none"),
//   parallel_tool_calls, add_generation_prompt, reasoning_format ("none"|"auto"|"deepseek"|
//   "deepseek-legacy"), enable_thinking, chat_template_kwargs (object), json_schema (string),
//   grammar (string).
// Result: prompt, format, format_name, grammar, grammar_lazy, trigger_patterns (regexes, as the
//   lazy grammar sampler takes them), trigger_tokens, preserved_tokens (token ids),
//   grammar_prefill_tokens (to feed a non-lazy chat grammar: the generation prompt),
//   generation_prompt_tokens (all of them, for the reasoning budget),
//   generation_prompt, additional_stops, parser (serialized), supports_thinking,
//   thinking_start_tag, thinking_end_tags.
ARBOR_CHAT_API char * arbor_chat_apply(const struct arbor_chat_templates * tmpls, const char * request_json,
                                  char ** error);

// A parser for one reply. Params (JSON object): format, reasoning_format, generation_prompt,
// parser (all from arbor_chat_apply's result), parse_tool_calls (default true).
ARBOR_CHAT_API struct arbor_chat_parser * arbor_chat_parser_init(const char * params_json, char ** error);
ARBOR_CHAT_API void arbor_chat_parser_free(struct arbor_chat_parser * parser);

// Parses the whole text so far (`is_partial` while more may come) into
// {"role", "content", "reasoning_content", "tool_calls": [{"type", "function": {"name",
// "arguments"}, "id"}]}.
ARBOR_CHAT_API char * arbor_chat_parse(struct arbor_chat_parser * parser, const char * text, bool is_partial,
                                  char ** error);

// llama-server's reasoning-budget sampler (common/reasoning-budget.h), for a plan whose template
// thinks. Params (JSON object): start_tag, end_tags (from arbor_chat_apply's thinking tags),
// budget (tokens of reasoning; -1: unlimited, the sampler then only tracks where the reasoning
// is), message (written before the first end tag when the budget forces it), prefill (token ids
// of the generation prompt, which may already open the reasoning). Add it to no chain: apply it
// before the grammar, and apply a lazy grammar only while the state is idle or done (as
// common_sampler does), so a tool-call trigger inside the reasoning does not fire.
ARBOR_CHAT_API struct llama_sampler * arbor_chat_reasoning_budget_init(const struct llama_vocab * vocab,
                                                                       const char * params_json, char ** error);
// 0 idle (before the reasoning), 1 counting, 2 forcing the end, 3 waiting for a whole UTF-8
// character, 4 done (after the reasoning).
ARBOR_CHAT_API int arbor_chat_reasoning_budget_state(const struct llama_sampler * smpl);
// The end sequence that closed the reasoning (to replay into a lazy grammar): its length, with up
// to `capacity` tokens copied into `out`; 0 when none.
ARBOR_CHAT_API int arbor_chat_reasoning_budget_end_match(const struct llama_sampler * smpl, llama_token * out,
                                                         int capacity);

ARBOR_CHAT_API void arbor_chat_string_free(char * s);

#ifdef __cplusplus
}
#endif
