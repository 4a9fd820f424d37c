"""The real server on the embedded model, through the official openai client and raw HTTP."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest

from tests.server.conftest import start_server, stop_server
from tests.server.near_tie import chat_steps, parting_problem

pytestmark = pytest.mark.model

SHORT = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def client(arbor_server):
    return openai.OpenAI(base_url=arbor_server.v1, api_key="unused", max_retries=0, timeout=120)


def idle_slots_consistent(base_url: str) -> list[dict]:
    """Every slot idle, and llama.cpp's memory agrees with what the engine thinks it holds."""
    deadline = time.monotonic() + 30
    while True:
        slots = httpx.get(base_url + "/slots", timeout=30).json()
        if not any(s["is_processing"] for s in slots) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for s in slots:
        assert not s["is_processing"], slots
        assert s["kv_pos_max"] == s["n_past"] - 1, f"slot KV out of step with the engine: {s}"
    return slots


def test_models_and_health(arbor_server, client):
    assert httpx.get(arbor_server.base_url + "/health").json() == {"status": "ok"}
    models = client.models.list()
    assert [m.id for m in models.data] == ["SmolLM2-135M-Instruct.Q4_1"]


def test_chat_non_stream_has_usage_timings_and_cache_extension(arbor_server, client):
    r = client.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", messages=SHORT, max_tokens=8,
                                       temperature=0)
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 5 and 1 <= r.usage.completion_tokens <= 8
    assert r.usage.prompt_tokens_details.cached_tokens >= 0
    extra = r.model_extra
    assert set(extra["timings"]) >= {"cache_n", "prompt_n", "prompt_ms", "predicted_n", "predicted_ms"}
    assert extra["arbor"]["cache"]["source"] in ("A", "S", "H", "D", "none")
    assert extra["arbor"]["cache"]["plan"] in ("A", "S", "H", "D", "compute")
    assert "est_ms" in extra["arbor"]["cache"]


def test_any_model_name_gets_the_served_model(client):
    """As llama-server does: a client hard-wired to another name is served, and told which model answered."""
    r = client.chat.completions.create(model="gpt-4o-mini", messages=SHORT, max_tokens=2, temperature=0)
    assert r.model == "SmolLM2-135M-Instruct.Q4_1"
    stream = client.completions.create(model="gpt-4o-mini", prompt="1, 2,", max_tokens=2, stream=True)
    assert {chunk.model for chunk in stream} == {"SmolLM2-135M-Instruct.Q4_1"}


def test_greedy_fast_path_matches_llama_cpp_greedy_sampler(tmp_path):
    """Plain greedy takes numpy's argmax; a zero logit bias forces llama.cpp's sampler chain.

    On a fresh one-slot server, so both answers see the same KV in the same cell order: a
    first request leaves the prompt in the slot, both below reuse it and place their new
    tokens after it. (On a server whose KV ring has wrapped, a new token may land in a cell
    before the prompt's, and the attention's sums, taken in cell order, may round a near tie
    the other way: a different order, not a different sampler.)"""
    server = start_server(tmp_path, "--parallel", "1", "--ctx-size", "1024")
    try:
        client = openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=120)
        kw = dict(model="", messages=[{"role": "user", "content": "Name three rivers."}], max_tokens=16,
                  temperature=0)
        client.chat.completions.create(**kw)
        fast = client.chat.completions.create(**kw)
        chain = client.chat.completions.create(**kw, logit_bias={"0": 0})
        assert fast.choices[0].message.content == chain.choices[0].message.content
    finally:
        stop_server(server)


def test_same_prompt_twice_reuses_the_slot_prefix(client):
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}]
    greedy = dict(messages=msgs, model="", max_tokens=4, temperature=0, logprobs=True, top_logprobs=5)
    first = client.chat.completions.create(**greedy)
    second = client.chat.completions.create(**greedy)
    assert second.usage.prompt_tokens_details.cached_tokens == second.usage.prompt_tokens - 1
    assert second.model_extra["arbor"]["cache"]["source"] == "A"
    assert second.model_extra["arbor"]["cache"]["plan"] == "A"
    # `second` computed one prompt token where `first` computed them all: a near-tie may flip (near_tie.py)
    steps = chat_steps(second.choices[0]), chat_steps(first.choices[0])
    assert parting_problem(*steps) is None, parting_problem(*steps)


def test_cache_stats_show_measured_rates_and_plans(arbor_server, client):
    client.chat.completions.create(messages=SHORT, model="", max_tokens=2, temperature=0)
    stats = httpx.get(arbor_server.base_url + "/cache/stats", timeout=30).json()
    assert stats["route"] == "cost"
    assert set(stats["costs"]) >= {"prefill_tokens_per_s", "restore_bytes_per_s", "kv_bytes_per_token"}
    assert sum(stats["plans"]["by_plan"].values()) >= 1 and stats["plans"]["recent"][-1]["plan"]
    assert stats["engine_thread"]["cache_ms"] >= 0
    assert set(stats["tree"]) == {"nodes", "tokens", "held_tokens"}  # the one tree of S, H and D


def test_stream_with_include_usage(client):
    stream = client.chat.completions.create(messages=SHORT, model="", max_tokens=8, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish and finish[-1] in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 1


def test_stream_matches_non_stream_greedy(client):
    kw = dict(messages=SHORT, model="", max_tokens=12, temperature=0)
    full = client.chat.completions.create(**kw).choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kw)
                       if c.choices)
    assert streamed == full


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string",
                       "enum": ["c", "f"]}}, "required": ["city", "unit"]},
    },
}
TIME_TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {
    "zone": {"type": "string"}}, "required": ["zone"]}}}


def test_tool_choice_required_gives_parseable_tool_calls(client):
    r = client.chat.completions.create(
        model="", messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER_TOOL, TIME_TOOL],
        tool_choice="required", max_tokens=60, temperature=0, parallel_tool_calls=False,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls and calls[0].function.name in ("get_weather", "get_time")
    args = json.loads(calls[0].function.arguments)
    if calls[0].function.name == "get_weather":
        assert isinstance(args["city"], str) and args["unit"] in ("c", "f")
    else:
        assert isinstance(args["zone"], str)


def test_named_tool_choice_streams_tool_call_deltas(client):
    stream = client.chat.completions.create(
        model="", messages=[{"role": "user", "content": "What time is it in Tokyo?"}],
        tools=[WEATHER_TOOL, TIME_TOOL], tool_choice={"type": "function", "function": {"name": "get_time"}},
        max_tokens=40, temperature=0, stream=True,
    )
    deltas = [tc for c in stream if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    # the first delta names the call, the rest stream its arguments (as OpenAI streams them)
    assert deltas[0].function.name == "get_time" and deltas[0].id and all(d.index == 0 for d in deltas)
    assert all(d.function.name is None and d.id is None for d in deltas[1:])
    assert "zone" in json.loads("".join(d.function.arguments or "" for d in deltas))


def test_tool_results_round_trip_into_the_next_turn(client):
    history = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps({"city": "Oslo", "unit": "c"})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"temp_c": -3})},
    ]
    r = client.chat.completions.create(model="", messages=history, tools=[WEATHER_TOOL], tool_choice="none",
                                       max_tokens=16, temperature=0)
    assert r.choices[0].message.content and not r.choices[0].message.tool_calls


def test_tool_choice_none_keeps_the_tools_in_the_prompt_so_the_prefix_is_reused(client):
    """An agent's last step forbids tools; its prompt must still start like the earlier steps'."""
    history = [{"role": "system", "content": "You answer questions about the weather in Norway, in one line."},
               {"role": "user", "content": "Is it cold in Tromsø in January?"}]
    auto = client.chat.completions.create(model="", messages=history, tools=[WEATHER_TOOL], max_tokens=4,
                                          temperature=0)
    none = client.chat.completions.create(model="", messages=history, tools=[WEATHER_TOOL], tool_choice="none",
                                          max_tokens=4, temperature=0)
    assert none.usage.prompt_tokens == auto.usage.prompt_tokens  # the same rendering, tools included
    assert none.usage.prompt_tokens_details.cached_tokens == none.usage.prompt_tokens - 1
    assert not none.choices[0].message.tool_calls


def test_json_schema_response_format(client):
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    r = client.chat.completions.create(
        model="", messages=[{"role": "user", "content": "What is 2+2? Reply in JSON."}], max_tokens=30,
        temperature=0, response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
    )
    assert isinstance(json.loads(r.choices[0].message.content)["answer"], int)


def test_text_completion_and_stop_string(client):
    r = client.completions.create(model="", prompt="1, 2, 3, 4,", max_tokens=20, temperature=0, stop=["7"])
    assert "7" not in r.choices[0].text
    assert r.choices[0].finish_reason in ("stop", "length")


def test_tokenize_detokenize_apply_template(arbor_server):
    b = arbor_server.base_url
    toks = httpx.post(b + "/tokenize", json={"content": "Hello world"}).json()["tokens"]
    assert toks and all(isinstance(t, int) for t in toks)
    assert httpx.post(b + "/detokenize", json={"tokens": toks}).json()["content"] == "Hello world"
    prompt = httpx.post(b + "/apply-template", json={"messages": SHORT}).json()["prompt"]
    assert "<|im_start|>user\nSay hello.<|im_end|>" in prompt and prompt.endswith("<|im_start|>assistant\n")


def test_props_slots_metrics(arbor_server, client):
    client.chat.completions.create(messages=SHORT, model="", max_tokens=2)
    b = arbor_server.base_url
    props = httpx.get(b + "/props").json()
    # the KV is one pool: a request may use all 4096 cells, not 4096 / 2
    assert props["total_slots"] == 2 and props["n_ctx_slot"] == 4096
    assert props["default_generation_settings"]["n_ctx"] == 4096 and props["arbor"]["kv_cells"] == 4096
    # the default (auto) turns paged attention on for a CPU KV with the patched build
    # (llama.cpp's self-check of every paged mask is off in a release build unless LLAMA_PAGED_ATTN_SELF_CHECK asks)
    assert props["arbor"]["paged_attention"] == {"compiled_in": True, "enabled": True, "page_size": 16, "note": None,
                                                 "placement": "owned", "self_check": {"on": False, "failures": 0}}
    assert props["arbor"]["stream_interval_ms"] == 10  # the default in force
    idle_slots_consistent(b)
    text = httpx.get(b + "/metrics").text
    for name in ("llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total", "llamacpp:requests_processing",
                 "arbor:cache_reused_tokens_total", "arbor:cache_tree_nodes", "arbor:kv_cells_defragmented_total"):
        assert name in text


def test_two_concurrent_streams_interleave(arbor_server):
    """Continuous batching, shown by event order: a short stream started while a long one is
    decoding gets all its tokens and ends while the long one is still producing tokens.

    The short stream starts only once the long one has its first token, and the long one has room
    for 200 tokens, so a late thread start on a busy machine cannot let one finish before the other
    begins (two streams started together raced that way once in CI)."""
    events: list[tuple[str, str]] = []
    lock = threading.Lock()
    long_started, short_ended = threading.Event(), threading.Event()

    def run(tag: str, question: str, max_tokens: int):
        body = {"messages": [{"role": "user", "content": question}], "max_tokens": max_tokens,
                "temperature": 0, "stream": True, "ignore_eos": True}
        after_short = 0
        with httpx.stream("POST", arbor_server.v1 + "/chat/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                delta = chunk["choices"][0]
                kind = "end" if delta["finish_reason"] else ("tok" if delta["delta"].get("content") else None)
                if not kind:
                    continue
                with lock:
                    events.append((tag, kind))
                if tag == "long":
                    long_started.set()
                    after_short += short_ended.is_set()
                    if after_short >= 3:
                        return  # it outlived the short stream: hang up (the server cancels it)
                elif kind == "end":
                    short_ended.set()

    long = threading.Thread(target=run, args=("long", "Count to one hundred.", 200))
    long.start()
    assert long_started.wait(timeout=120), events
    short = threading.Thread(target=run, args=("short", "List three fruits.", 16))
    short.start()
    for t in (short, long):
        t.join(timeout=180)
    end_short = events.index(("short", "end"))
    first_short = events.index(("short", "tok"))
    assert ("long", "end") not in events[:end_short], events
    long_during_short = sum(1 for e in events[first_short:end_short] if e == ("long", "tok"))
    short_toks = sum(1 for e in events if e == ("short", "tok"))
    long_after_short = sum(1 for e in events[end_short:] if e == ("long", "tok"))
    assert long_during_short >= 5 and short_toks >= 5 and long_after_short >= 1, events
    idle_slots_consistent(arbor_server.base_url)  # the hung-up stream is cancelled before the next test


def test_disconnect_cancels_and_frees_the_slot(arbor_server):
    b = arbor_server.base_url
    before = httpx.get(b + "/metrics").text
    body = {"messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 1500,
            "ignore_eos": True, "stream": True}
    with httpx.stream("POST", arbor_server.v1 + "/chat/completions", json=body, timeout=60) as r:
        got = 0
        for line in r.iter_lines():
            if line.startswith("data: ") and '"content"' in line:
                got += 1
            if got >= 3:
                break  # leaving the block closes the connection mid-stream
    slots = idle_slots_consistent(b)
    after = httpx.get(b + "/metrics").text
    assert _counter(after, 'arbor:requests_total{reason="cancelled"}') == \
        _counter(before, 'arbor:requests_total{reason="cancelled"}') + 1
    assert all(s["n_past"] < 1000 for s in slots)


def _counter(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0
