"""llama.cpp's chat layer through Arbor's C ABI (libarbor-chat), on the real templates the pinned
llama.cpp ships: rendering, the families' reply formats, streaming deltas, the tool fallback.
No model is loaded: templates are given as source (the vocabulary-dependent parts, triggers and
grammar prefill, are covered on the real engine by tests/server/api/test_family_constraints_real.py)."""

from __future__ import annotations

import json

import pytest

from harness.models.family_model import FAMILIES, template_text
from server.api.engine_bridge.chat_layer import ChatLayerError, ChatTemplates, ReplyParser
from server.api.engine_bridge.grammars import forced_call_grammar
from server.api.engine_bridge.reply_stream import ContentDelta, ReasoningDelta, ReplyStream, ToolCallDelta
from server.api.engine_bridge.tool_fallback import inject_tools, template_source

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
ASK = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Weather in Paris?"}]
CALLED = ASK + [
    {"role": "assistant", "content": "", "reasoning_content": "I should look it up.",
     "tool_calls": [{"id": "call0abc1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call0abc1", "content": '{"temp_c": 12}'},
]
MULTI = ASK + [{"role": "assistant", "content": "It is 12 C."}, {"role": "user", "content": "And tomorrow?"}]

# What a model of each family writes for "reasoning, then one call of get_weather(city=Paris)"
# (or the call alone, for families that do not reason), after the template's generation prompt.
REPLIES = {
    "qwen3": ('<think>\nThe user wants weather.\n</think>\n\n<tool_call>\n'
              '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', True),
    "qwen3.5": ('The user wants weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n'
                '</parameter>\n</function>\n</tool_call>', True),
    "qwq": ('The user wants weather.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
            '\n</tool_call>', True),
    "deepseek-r1": ('The user wants weather.\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function'
                    '<｜tool▁sep｜>'
                    'get_weather\n```json\n{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>', True),
    "gpt-oss": ('<|channel|>analysis<|message|>The user wants weather.<|end|><|start|>assistant<|channel|>commentary '
                'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}', True),
    "llama3.1": ('{"name": "get_weather", "parameters": {"city": "Paris"}}', False),
    "mistral-nemo": ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abcdefghi"}]', False),
    "devstral": ('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', False),
    "hermes3": ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', False),
    "glm4.6": ('\n<think>The user wants weather.</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n'
               '<arg_value>Paris</arg_value>\n</tool_call>', True),
    "kimi-k2": ('<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>'
                '{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>', False),
    "functionary3.2": ('get_weather\n{"city": "Paris"}', False),
    "command-r7b": ('<|START_THINKING|>The user wants weather.<|END_THINKING|><|START_ACTION|>[\n    {"tool_call_id": '
                    '"0", "tool_name": "get_weather", "parameters": {"city": "Paris"}}\n]<|END_ACTION|>', True),
    "gemma4": ('<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>', False),
}


@pytest.fixture(scope="module")
def templates():
    cache: dict[str, ChatTemplates] = {}

    def get(family: str) -> ChatTemplates:
        if family not in cache:
            cache[family] = ChatTemplates(None, template_text(FAMILIES[family].template))
        return cache[family]
    return get


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_template_renders_the_five_conversations(templates, family):
    t = templates(family)
    for messages, tools in ((ASK, None), (ASK, [WEATHER]), (CALLED, [WEATHER]), (MULTI, None), (CALLED, None)):
        plan = t.apply({"messages": messages, "tools": tools})
        assert "Weather in Paris?" in plan.prompt, family
    with_tools = t.apply({"messages": ASK, "tools": [WEATHER]})
    if t.caps.get("supports_tools"):
        assert "get_weather" in with_tools.prompt  # the family describes the tools itself
    followed = t.apply({"messages": MULTI, "tools": None}).prompt
    assert "It is 12 C." in followed and followed.index("It is 12 C.") < followed.index("And tomorrow?")


@pytest.mark.parametrize("family", sorted(REPLIES))
def test_a_familys_reply_parses_into_reasoning_and_a_tool_call(templates, family):
    text, reasons = REPLIES[family]
    plan = templates(family).apply({"messages": ASK, "tools": [WEATHER]})
    reply = ReplyParser(plan, reasoning_format="auto", parse_tool_calls=True).parse(text, partial=False)
    assert [c.name for c in reply.tool_calls] == ["get_weather"], reply
    assert json.loads(reply.tool_calls[0].arguments) == {"city": "Paris"}
    assert reply.content.strip() == ""
    if reasons:
        assert reply.reasoning_content.strip().removeprefix("<think>").strip() == "The user wants weather."


def test_granites_reasoning_is_read_apart_from_its_answer(templates):
    """Granite 3.3 (its tool-call reply is not pinned down here: llama.cpp's own tests check only
    its reasoning, as this does)."""
    plan = templates("granite3.3").apply({"messages": ASK})
    reply = ReplyParser(plan, reasoning_format="auto", parse_tool_calls=False).parse(
        "<think>The user wants weather.</think>It is sunny.", partial=False)
    assert (reply.reasoning_content, reply.content) == ("The user wants weather.", "It is sunny.")


def test_reasoning_format_none_leaves_the_thinking_in_the_content(templates):
    text = "<think>\nHmm.\n</think>\n\nIt is sunny."

    def read(fmt: str):
        plan = templates("qwen3").apply({"messages": ASK, "reasoning_format": fmt})
        return ReplyParser(plan, reasoning_format=fmt, parse_tool_calls=False).parse(text, partial=False)
    auto, none = read("auto"), read("none")
    assert (auto.reasoning_content.strip(), auto.content.strip()) == ("Hmm.", "It is sunny.")
    assert none.reasoning_content == "" and "<think>" in none.content and "It is sunny." in none.content


def test_enable_thinking_false_closes_the_thinking_in_the_prompt(templates):
    on = templates("qwen3").apply({"messages": ASK, "enable_thinking": True}).prompt
    off = templates("qwen3").apply({"messages": ASK, "enable_thinking": False}).prompt
    assert off.startswith(on) and "<think>\n\n</think>" in off[len(on):]


def test_qwen3_drops_past_reasoning_and_gpt_oss_keeps_it_before_a_tool_call(templates):
    qwen = templates("qwen3").apply({"messages": MULTI[:2] + [
        {"role": "assistant", "content": "It is 12 C.", "reasoning_content": "Secret thought."},
        {"role": "user", "content": "And tomorrow?"}]}).prompt
    assert "Secret thought." not in qwen
    oss = templates("gpt-oss").apply({"messages": CALLED, "tools": [WEATHER]}).prompt
    assert "I should look it up." in oss


def test_streaming_deltas_add_up_to_the_final_reply_and_never_leak_markup(templates):
    plan = templates("qwen3").apply({"messages": ASK, "tools": [WEATHER]})
    text = ('<think>\nThe user wants weather.\n</think>\n\nLet me check.\n<tool_call>\n'
            '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
    stream = ReplyStream(ReplyParser(plan, reasoning_format="auto", parse_tool_calls=True))
    deltas = [d for ch in text for d in stream.feed(ch)] + stream.finish()
    reasoning = "".join(d.text for d in deltas if isinstance(d, ReasoningDelta))
    content = "".join(d.text for d in deltas if isinstance(d, ContentDelta))
    calls = [d for d in deltas if isinstance(d, ToolCallDelta)]
    assert reasoning.strip() == "The user wants weather." and content.strip() == "Let me check."
    assert "<" not in content
    assert calls[0].name == "get_weather" and len(calls[0].id) == 9 and calls[0].id.isalnum()
    assert all(c.name is None for c in calls[1:]) and {c.index for c in calls} == {0}
    assert json.loads("".join(c.arguments for c in calls)) == {"city": "Paris"}
    assert stream.calls[0].id == calls[0].id and json.loads(stream.calls[0].arguments) == {"city": "Paris"}


def test_a_call_cut_off_by_max_tokens_is_dropped(templates):
    plan = templates("qwen3").apply({"messages": ASK, "tools": [WEATHER]})
    stream = ReplyStream(ReplyParser(plan, reasoning_format="auto", parse_tool_calls=True))
    reply = stream.read('Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"ci')
    assert reply.tool_calls == () and stream.truncated_call and reply.content.strip() == "Sure."


def test_a_template_llama_cpp_cannot_parse_is_refused_with_its_message():
    with pytest.raises(ChatLayerError) as err:
        ChatTemplates(None, "{% for m in messages %}{{ m.content }")
    assert str(err.value)


def test_a_template_without_tools_gets_the_hermes_format():
    chatml = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
              "'<|im_end|>\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
    t = ChatTemplates(None, chatml)
    assert not t.native_tools and t.tool_format is not t
    written = inject_tools([{"role": "user", "content": "hi"}] + CALLED[2:], [WEATHER])
    prompt = t.apply({"messages": written}).prompt
    assert "<tools>" in prompt and '"name": "get_weather"' in prompt
    assert "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>" in prompt
    assert "<tool_response>\n{\"temp_c\": 12}\n</tool_response>" in prompt
    plan = t.tool_format.apply({"messages": ASK, "tools": [WEATHER]})
    assert plan.grammar_lazy and plan.trigger_patterns
    reply = ReplyParser(plan, reasoning_format="auto", parse_tool_calls=True).parse(REPLIES["hermes3"][0],
                                                                                    partial=False)
    assert reply.tool_calls[0].name == "get_weather"
    assert ChatTemplates(None, template_source()).native_tools


def test_forced_call_grammar_allows_no_text_before_the_call_and_one_call():
    plan = ChatTemplates(None, template_source()).apply({"messages": ASK, "tools": [WEATHER],
                                                         "tool_choice": "required"})
    root = next(line for line in plan.grammar.split("\n") if line.startswith("root ::= "))
    assert "until-" in root  # llama.cpp's own grammar lets the reply talk first
    forced = forced_call_grammar(plan.grammar, parallel=False)
    forced_root = next(line for line in forced.split("\n") if line.startswith("root ::= "))
    assert "until-" not in forced_root and "\ntool-calls ::= tool-call\n" in forced
    assert "tool-calls ::= tool-call (space tool-call)*" in forced_call_grammar(plan.grammar, parallel=True)


def test_a_thinking_template_gets_a_reasoning_budget_when_limited_or_with_lazy_tools(templates):
    from server.api.engine_bridge.chat_request import ChatCompletionRequest
    from server.api.engine_bridge.prompting import _reasoning_budget
    from server.engine.sampling_params import Constraint
    from server.settings import ServerSettings

    settings = ServerSettings()
    plan = templates("qwen3").apply({"messages": ASK, "tools": [WEATHER]})
    body = ChatCompletionRequest(messages=ASK)
    lazy = Constraint(plan.grammar, lazy=True, trigger_patterns=plan.trigger_patterns)
    assert _reasoning_budget(body, plan, Constraint(), settings) is None  # unlimited, no lazy grammar
    tracked = _reasoning_budget(body, plan, lazy, settings)  # only tracks where the reasoning is
    assert tracked.budget == -1 and tracked.start_tag == "<think>" and tracked.end_tags == ("</think>",)
    limited = _reasoning_budget(ChatCompletionRequest(messages=ASK, reasoning_budget_tokens=64,
                                                      reasoning_budget_message="Enough."), plan, Constraint(), settings)
    assert (limited.budget, limited.message) == (64, "Enough.")
    assert _reasoning_budget(body, templates("llama3.1").apply({"messages": ASK}), lazy, settings) is None
