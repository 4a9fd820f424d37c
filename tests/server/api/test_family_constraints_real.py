"""Each family's own constrained path on the real engine (issue 60, item 4): requests with `tools` and
every `tool_choice` form, and no client grammar, rendered and constrained by the chat layer
(server/api/engine_bridge/prompting.py: llama.cpp's lazy tool-call grammar, its triggers and its
grammar prefill) and run by the engine (server/engine/sampling.py), on models that write their
family's trigger by themselves (tests/server/api/scripted_family.py: a bigram machine that writes
the trigger, then stops, wherever no grammar holds it).

- `none`: no grammar; the model writes the trigger and stops: its text comes back as content, no call.
- `auto`: the family's lazy grammar, waiting for the family's trigger (patterns or tokens, as the
  plan gives them): the model writes the trigger, the grammar wakes there and the reply goes on
  into a whole call, which the model alone would not write (it stops after the trigger, as `none`
  shows); the parsed call is one the grammar allows (enum arguments: get_weather(city=Paris) or
  get_time(zone=UTC)). Llama 3.1 has no lazy grammar in the pinned llama.cpp (its calls are read
  from free text): there `auto` is unconstrained, asserted as such.
- `required` and a named function: the family's grammar from the first token, fed the generation
  prompt first (the grammar prefill, where the family's grammar starts with it): the named call is
  get_time(zone=UTC); without the prefill the same request is made to write the generation prompt again.

Families: Qwen3 and Llama 3.1 on their own vocabularies (the base the pinned llama.cpp ships plus the
family's added tokens at their ids); gpt-oss, Mistral-Nemo, Devstral and Hermes 3 (the Hermes family)
on harness/models/family_model.py's stand-ins, as the pinned llama.cpp ships no o200k_harmony, Tekken
or Hermes 3 vocabulary (their control tokens are text of several tokens).
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from types import SimpleNamespace

import pytest

from tests.cores import model_threads
from tests.server.api.scripted_family import TRIGGER_TEXT, write_scripted_family

pytestmark = pytest.mark.model

FAMILY_NAMES = ["qwen3", "gpt-oss", "hermes3", "llama3.1", "mistral-nemo", "devstral"]  # by vocabulary


def _tool(name: str, arg: str, value: str) -> dict:
    return {"type": "function", "function": {"name": name, "description": f"{name} of a place", "parameters": {
        "type": "object", "properties": {arg: {"type": "string", "enum": [value]}}, "required": [arg]}}}


TOOLS = [_tool("get_weather", "city", "Paris"), _tool("get_time", "zone", "UTC")]
ALLOWED = {("get_weather", '{"city": "Paris"}'), ("get_time", '{"zone": "UTC"}')}
NAMED = {"type": "function", "function": {"name": "get_time"}}
ASK = [{"role": "user", "content": "Weather and time in Paris?"}]


@pytest.fixture(scope="module", params=FAMILY_NAMES)
def family(request, tmp_path_factory):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (run scripts/setup.sh)")
    from harness.models.family_model import FAMILIES, template_text
    from server import bootstrap
    from server.api.engine_bridge.chat_layer import ChatTemplates
    from server.settings import ServerSettings

    name = request.param
    prompt = ChatTemplates(None, template_text(FAMILIES[name].template)).apply(
        {"messages": ASK, "tools": TOOLS, "add_generation_prompt": True}).prompt
    scripted = write_scripted_family(name, tmp_path_factory.mktemp(name) / f"{name}.gguf", prompt)
    settings = ServerSettings(model=scripted.path, parallel=1, ctx_size=4096, batch_size=512,
                              threads=model_threads(), spec_type="none")
    model = bootstrap.load(settings)
    model.template = ChatTemplates(model.runtime.model, template_override=model.template_source)
    try:
        yield SimpleNamespace(name=name, scripted=scripted, model=model, settings=settings)
    finally:
        model.template.close()
        model.close()


def answer(fam, tool_choice, *, prefill: bool = True, max_tokens: int = 80) -> SimpleNamespace:
    """The request through the API's bridge and the engine: its prepared request, the generated
    text and tokens, and the family's parser's reading of the reply."""
    import threading

    from server.api.engine_bridge.chat_layer import ChatLayerError, ParsedReply, ReplyParser
    from server.api.engine_bridge.chat_request import ChatCompletionRequest
    from server.api.engine_bridge.prompting import prepare_chat
    from server.engine.sequence import Finished, TextDelta

    body = ChatCompletionRequest.model_validate({
        "messages": ASK, "tools": TOOLS, "tool_choice": tool_choice, "parallel_tool_calls": False,
        "max_tokens": max_tokens, "temperature": 0})
    prepared = prepare_chat(body, fam.model, fam.settings)
    gen = prepared.generation
    if not prefill:
        c = gen.sampling.constraint
        gen = replace(gen, sampling=replace(gen.sampling, constraint=replace(c, prefill=())))
    out = SimpleNamespace(text="", tokens=[], final=None)
    done = threading.Event()

    def sink(ev):
        if isinstance(ev, TextDelta):
            out.text += ev.text
            out.tokens += list(ev.tokens)
        elif isinstance(ev, Finished):
            out.final = ev
            done.set()

    fam.model.engine.submit(gen, sink)
    assert done.wait(120), "request did not finish"
    conv = prepared.conversation
    parser = ReplyParser(conv.plan, reasoning_format=conv.reasoning_format, parse_tool_calls=conv.parse_tool_calls)
    try:
        parsed = parser.parse(out.text, partial=False)
    except ChatLayerError:  # not the family's format at all (the API then returns it as content)
        parsed = ParsedReply(out.text, "", ())
    finally:
        parser.close()
    calls = {(c.name, json.dumps(json.loads(c.arguments))) for c in parsed.tool_calls}
    return SimpleNamespace(prepared=prepared, constraint=gen.sampling.constraint, plan=conv.plan, text=out.text,
                           tokens=out.tokens, final=out.final, parsed=parsed, calls=calls)


def test_tool_choice_none_leaves_the_reply_unconstrained(family):
    """The model alone: it writes the trigger, then stops; nothing constrains it, nothing is parsed as a call."""
    got = answer(family, "none")
    assert got.constraint.grammar is None
    assert got.tokens == list(family.scripted.chain), (got.text, got.tokens)
    assert got.final.finish_reason == "stop" and not got.parsed.tool_calls
    assert TRIGGER_TEXT[family.name].strip() in got.text


def test_auto_waits_for_the_familys_trigger_then_the_grammar_finishes_the_call(family):
    got = answer(family, "auto")
    c, plan = got.constraint, got.plan
    assert got.prepared.generation.prompt_tokens[-1] == family.scripted.start  # the model writes its chain
    if family.name == "llama3.1":  # no lazy grammar for Llama 3.x in the pinned llama.cpp: calls read from text
        assert c.grammar is None and not plan.grammar
        assert got.tokens == list(family.scripted.chain) and not got.parsed.tool_calls
        return
    assert c.grammar and c.lazy and c.prefill == ()
    assert (c.trigger_patterns, c.trigger_tokens) == (plan.trigger_patterns, plan.trigger_tokens)
    trigger = TRIGGER_TEXT[family.name]
    fired = [p for p in c.trigger_patterns if re.search(p, trigger)] + \
        [t for t in c.trigger_tokens if t in family.scripted.chain]
    assert fired, (c.trigger_patterns, c.trigger_tokens, trigger)  # the text the model writes wakes the grammar
    assert got.tokens[:len(family.scripted.chain)] == list(family.scripted.chain)  # the model wrote the trigger
    assert len(got.tokens) > len(family.scripted.chain), got.text  # ... and was held past where it stops alone
    assert len(got.calls) == 1 and got.calls <= ALLOWED, (got.text, got.parsed)
    assert not got.parsed.content.strip(), got.parsed


def test_required_is_the_familys_grammar_from_the_first_token(family):
    got = answer(family, "required")
    c = got.constraint
    assert c.grammar and not c.lazy and c.prefill == got.plan.generation_prompt_tokens
    assert len(got.calls) == 1 and got.calls <= ALLOWED, (got.text, got.parsed)
    assert got.final.finish_reason == "stop"


def test_a_named_function_is_forced_and_the_grammar_prefill_applied(family):
    """The named function's grammar from the first token. Where it starts with the generation prompt
    (the prompt already ends with it), the engine feeds that to the grammar before the reply
    (Mistral-Nemo and Devstral have none): the reply is the call. The same request with the prefill
    left out is made to write the generation prompt again first."""
    got = answer(family, NAMED)
    c, prompt = got.constraint, got.plan.generation_prompt
    assert c.grammar and not c.lazy and c.prefill == got.plan.generation_prompt_tokens
    assert got.calls == {("get_time", '{"zone": "UTC"}')}, (got.text, got.parsed)
    assert got.final.finish_reason == "stop"
    if not c.prefill:
        assert not prompt, prompt
        return
    literal = '"' + prompt.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    assert got.prepared.prompt_text.endswith(prompt) and literal in c.grammar, c.grammar
    rt, opening = family.model.runtime, prompt[:12]  # "<|im_start|>", "<|start|>ass", "<|start_head"
    assert not rt.detokenize(got.tokens, special=True).startswith(opening)
    without = answer(family, NAMED, prefill=False, max_tokens=16)
    assert rt.detokenize(without.tokens, special=True).startswith(opening), without.text
