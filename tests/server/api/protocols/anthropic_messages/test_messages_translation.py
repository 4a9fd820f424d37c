"""The Messages API's translation without a model: request validation, the chat request a
Messages request becomes, cache_control breakpoints and usage, stop reasons, the SSE events
(read back by the `anthropic` client's own accumulator), the error format middleware and the
x-api-key check."""

from __future__ import annotations

import asyncio
import json

import pytest
from anthropic.lib.streaming._messages import accumulate_event

from server.api.engine_bridge.chat_layer import ParsedReply
from server.api.engine_bridge.reply_stream import ContentDelta, ReasoningDelta, ReplyStream, ToolCall, ToolCallDelta
from server.api.http.deps import api_key_error
from server.api.http.errors import APIError
from server.api.protocols.anthropic_messages.cache_control import Breakpoint, PromptCache, keep_hint, last_breakpoint
from server.api.protocols.anthropic_messages.errors import AnthropicErrors
from server.api.protocols.anthropic_messages.events import MessageEvents
from server.api.protocols.anthropic_messages.reply import message, stop_reason
from server.api.protocols.anthropic_messages.request import CountTokensRequest, MessagesRequest, parse_request
from server.api.protocols.anthropic_messages.translate import chat_request
from server.engine.sequence import CacheReport, Finished, TextDelta
from server.settings import ServerSettings

SETTINGS = ServerSettings()
WEATHER = {"name": "get_weather", "description": "Weather", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def body(**fields) -> MessagesRequest:
    return parse_request(MessagesRequest, {"model": "m", "max_tokens": 16, **fields})


def refused(**fields) -> APIError:
    with pytest.raises(APIError) as info:
        chat_request(body(**fields), SETTINGS)
    assert info.value.status == 400
    return info.value


def test_a_conversation_becomes_the_chat_request_chat_completions_serve():
    chat = chat_request(body(
        system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Use tools."}],
        tools=[WEATHER], tool_choice={"type": "any"}, stop_sequences=["END"], temperature=0.2, top_k=5,
        thinking={"type": "enabled", "budget_tokens": 64},
        messages=[
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "user", "content": [{"type": "text", "text": "And be quick."}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Call the tool.", "signature": "sig"},
                {"type": "tool_use", "id": "abc123def", "name": "get_weather", "input": {"city": "Oslo"}}]},
            {"role": "user", "content": [
                {"type": "text", "text": "Here you go."},
                {"type": "tool_result", "tool_use_id": "abc123def", "content": [{"type": "text", "text": "-3 C"}]}]},
        ]), SETTINGS)
    msgs = [m.model_dump(exclude_none=True) for m in chat.messages]
    assert msgs[0] == {"role": "system", "content": "Be brief.\nUse tools."}
    assert msgs[1] == {"role": "user", "content": "Weather in Oslo?\nAnd be quick."}  # one turn, as Anthropic's
    assert msgs[2]["role"] == "assistant" and msgs[2]["reasoning_content"] == "Call the tool."
    assert msgs[2]["tool_calls"][0]["id"] == "abc123def"
    assert msgs[2]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": {"city": "Oslo"}}
    assert msgs[3] == {"role": "tool", "tool_call_id": "abc123def", "content": "-3 C"}  # results before the text
    assert msgs[4] == {"role": "user", "content": "Here you go."}
    assert chat.tool_choice == "required" and chat.parallel_tool_calls is True
    assert chat.tools and chat.tools[0].function.parameters == WEATHER["input_schema"]
    assert chat.stop == ["END"] and chat.temperature == 0.2 and chat.top_k == 5 and chat.max_tokens == 16
    assert chat.reasoning_budget_tokens == 64


@pytest.mark.parametrize("choice,expected,parallel", [
    ({"type": "auto"}, "auto", True),
    ({"type": "auto", "disable_parallel_tool_use": True}, "auto", False),
    ({"type": "any", "disable_parallel_tool_use": True}, "required", False),
    ({"type": "none"}, "none", True),
])
def test_tool_choice(choice, expected, parallel):
    chat = chat_request(body(tools=[WEATHER], tool_choice=choice, messages=[{"role": "user", "content": "x"}]),
                        SETTINGS)
    assert chat.tool_choice == expected and chat.parallel_tool_calls is parallel


def test_named_tool_choice_thinking_off_and_error_results():
    chat = chat_request(body(tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"},
                             thinking={"type": "disabled"}, messages=[
                                 {"role": "assistant", "content": [
                                     {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}]},
                                 {"role": "user", "content": [
                                     {"type": "tool_result", "tool_use_id": "t1", "is_error": True,
                                      "content": "no such city"}]}]), SETTINGS)
    assert chat.tool_choice.function == {"name": "get_weather"}
    assert chat.reasoning_effort == "none"
    assert chat.messages[-1].role == "tool" and chat.messages[-1].content == "Error: no such city"


def test_a_tool_result_must_answer_the_turn_before_it():
    err = refused(messages=[
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
        {"role": "user", "content": "thanks"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "late"}]}])
    assert err.param == "messages.3.content.0" and "tool_use_id 't1'" in err.message


def test_stop_sequence_limits_follow_the_server_flags():
    assert "--max-stop" in refused(messages=[{"role": "user", "content": "x"}], stop_sequences=["a"] * 17).message
    assert "--max-stop-chars" in refused(messages=[{"role": "user", "content": "x"}],
                                         stop_sequences=["a" * 300]).message


@pytest.mark.parametrize("raw,needle", [
    ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens: Field required"),
    ({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {}}]}]}, "image content blocks are not supported"),
    ({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": [
        {"type": "document", "source": {}}]}]}, "document content blocks are not supported"),
    ({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "a", "content": [{"type": "image"}]}]}]}, "image content blocks"),
    ({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "x"}]}]},
     "messages.0.content.0: Input tag 'x'"),
    ({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}],
      "tools": [{"name": "f", "input_schema": {"type": "array"}}]}, "tools.0: function parameters must be"),
    ({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "bash_20250124", "name": "bash"}]}, "tool type 'bash_20250124' is not supported"),
    ({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}],
      "tool_choice": {"type": "any"}}, "'any' needs at least one tool"),
    ({"model": "m", "max_tokens": 1, "messages": [{"role": "assistant", "content": [
        {"type": "tool_result", "tool_use_id": "a"}]}]}, "belongs in a user message"),
])
def test_bad_requests_name_the_field(raw, needle):
    with pytest.raises(APIError) as info:
        parse_request(MessagesRequest, raw)
    assert info.value.status == 400 and needle in info.value.message


def test_count_tokens_needs_no_max_tokens():
    parse_request(CountTokensRequest, {"model": "m", "messages": [{"role": "user", "content": "x"}]})


EPHEMERAL = {"type": "ephemeral"}


def test_the_last_breakpoint_in_anthropic_prefix_order():
    text = {"type": "text", "text": "x"}
    assert last_breakpoint(body(messages=[{"role": "user", "content": "x"}])) is None
    assert last_breakpoint(body(tools=[{**WEATHER, "cache_control": EPHEMERAL}],
                                messages=[{"role": "user", "content": "x"}])) == Breakpoint("tools", index=0)
    assert last_breakpoint(body(tools=[{**WEATHER, "cache_control": EPHEMERAL}],
                                system=[{**text, "cache_control": EPHEMERAL}, text],
                                messages=[{"role": "user", "content": "x"}])) == Breakpoint("system", index=0)
    assert last_breakpoint(body(system=[{**text, "cache_control": EPHEMERAL}], messages=[
        {"role": "user", "content": [text, {**text, "cache_control": EPHEMERAL}, text]},
        {"role": "assistant", "content": "y"}])) == Breakpoint("messages", message=0, block=1)
    assert last_breakpoint(body(messages=[
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                      "content": [{**text, "cache_control": EPHEMERAL}]}]}])) == \
        Breakpoint("messages", message=1, block=0)
    assert last_breakpoint(body(cache_control=EPHEMERAL, messages=[{"role": "user", "content": "x"}])) == \
        Breakpoint("end")


def test_usage_adds_up_to_the_prompt():
    assert PromptCache().usage(100, 30) == {"input_tokens": 70, "cache_creation_input_tokens": 0,
                                            "cache_read_input_tokens": 30}
    assert PromptCache(80).usage(100, 30) == {"input_tokens": 20, "cache_creation_input_tokens": 50,
                                              "cache_read_input_tokens": 30}
    assert PromptCache(20).usage(100, 30) == {"input_tokens": 70, "cache_creation_input_tokens": 0,
                                              "cache_read_input_tokens": 30}


def test_the_keep_hint_names_the_prefix_and_pins_it():
    a, b = keep_hint([1, 2, 3]), keep_hint([1, 2, 3])
    assert a == b and a.pin is True and a.session and a.session.startswith("cache_control:")
    assert keep_hint([1, 2, 4]).session != a.session


def finished(reason: str = "stop", stop_word: str | None = None, completion: int = 5) -> Finished:
    return Finished(reason, prompt_tokens=50, cached_tokens=20, completion_tokens=completion, prompt_ms=1.0,
                    predicted_ms=1.0, cache=CacheReport(), stop_word=stop_word)


CALL = ToolCall("abc123def", "get_weather", '{"city": "Oslo"}')


@pytest.mark.parametrize("fin,calls,stops,expected", [
    (finished("length"), [], [], ("max_tokens", None)),
    (finished("length"), [CALL], [], ("max_tokens", None)),
    (finished(), [CALL], [], ("tool_use", None)),
    (finished(stop_word="END"), [], ["END"], ("stop_sequence", "END")),
    (finished(stop_word="<|im_end|>"), [], ["END"], ("end_turn", None)),  # the template's own end marker
    (finished(), [], [], ("end_turn", None)),
])
def test_stop_reasons(fin, calls, stops, expected):
    stop = stop_reason(fin, calls, stops)
    assert (stop.reason, stop.sequence) == expected


def test_a_whole_message_has_its_blocks_in_order():
    reply = ParsedReply("It is cold.", "Think first.", ())
    msg = message("msg_1", "m", reply, [CALL], finished(), stop_reason(finished(), [CALL], []), PromptCache(40))
    assert [b["type"] for b in msg["content"]] == ["thinking", "text", "tool_use"]
    assert msg["content"][2] == {"type": "tool_use", "id": "abc123def", "name": "get_weather",
                                 "input": {"city": "Oslo"}}
    assert msg["usage"] == {"input_tokens": 10, "cache_creation_input_tokens": 20, "cache_read_input_tokens": 20,
                            "output_tokens": 5}
    assert msg["stop_reason"] == "tool_use"


def read_events(sse: str) -> list[dict]:
    """Server-sent events back to (event name, data), checked for the `event:` line."""
    out = []
    for frame in sse.split("\n\n"):
        if not frame:
            continue
        kind, data = frame.split("\n")
        data_obj = json.loads(data.removeprefix("data: "))
        assert kind == f"event: {data_obj['type']}"
        out.append(data_obj)
    return out


def test_streamed_events_build_the_message_in_the_anthropic_client():
    out = MessageEvents("msg_1", "m", ReplyStream(None), 50, PromptCache(30), [])
    sse = out.opening()
    sse += out._frames([ReasoningDelta("Hm"), ReasoningDelta("m."), ContentDelta("Let me "), ContentDelta("look."),
                        ToolCallDelta(0, "", id="abc123def", name="get_weather"), ToolCallDelta(0, '{"city": '),
                        ToolCallDelta(0, '"Oslo"}')])
    sse += out.finish(0, finished())
    events = read_events(sse)
    assert [e["type"] for e in events[:2]] == ["message_start", "ping"]
    snapshot, bufs = None, {}
    for e in events:
        if e["type"] != "ping":
            snapshot = accumulate_event(event=e, current_snapshot=snapshot, json_bufs=bufs)
    assert snapshot is not None
    assert [b.type for b in snapshot.content] == ["thinking", "text", "tool_use"]
    assert snapshot.content[0].thinking == "Hmm." and snapshot.content[1].text == "Let me look."
    assert snapshot.content[2].input == {"city": "Oslo"}
    # the reply stream (plain text here) found no calls: the stop reason is read from it
    assert snapshot.stop_reason == "end_turn"
    assert (snapshot.usage.input_tokens, snapshot.usage.cache_read_input_tokens,
            snapshot.usage.cache_creation_input_tokens, snapshot.usage.output_tokens) == (20, 20, 10, 5)
    assert [e["index"] for e in events if e["type"] == "content_block_start"] == [0, 1, 2]
    assert [e["index"] for e in events if e["type"] == "content_block_stop"] == [0, 1, 2]


def test_a_plain_text_stream_and_an_engine_error():
    out = MessageEvents("msg_1", "m", ReplyStream(None), 5, PromptCache(), ["END"])
    events = read_events(out.opening() + out.delta(0, TextDelta("Hi", [1])) + out.delta(0, TextDelta(" there", [2]))
                         + out.finish(0, finished(stop_word="END")))
    deltas = [e["delta"]["text"] for e in events if e["type"] == "content_block_delta"]
    assert deltas == ["Hi", " there"]
    assert events[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    (err,) = read_events(out.error(APIError("busy", status=503)))
    assert err == {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}


async def _call(app, path: str) -> tuple[int, dict, bytes]:
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    await app({"type": "http", "method": "POST", "path": path, "headers": []}, receive, send)
    start = sent[0]
    return start["status"], dict(start["headers"]), b"".join(m.get("body", b"") for m in sent[1:])


def test_the_error_middleware_rewrites_errors_on_messages_paths_only():
    async def openai_error(scope, receive, send):
        await APIError("too big", status=413, code="request_too_large").response()(scope, receive, send)

    app = AnthropicErrors(openai_error)
    status, headers, raw = asyncio.run(_call(app, "/v1/messages"))
    assert status == 413 and json.loads(raw) == {"type": "error", "error": {"type": "request_too_large",
                                                                           "message": "too big"}}
    assert headers[b"content-length"] == str(len(raw)).encode()
    status, _, raw = asyncio.run(_call(app, "/v1/chat/completions"))
    assert status == 413 and set(json.loads(raw)) == {"error"}

    async def broken(scope, receive, send):
        raise RuntimeError("secret detail")

    status, _, raw = asyncio.run(_call(AnthropicErrors(broken), "/v1/messages/count_tokens"))
    assert status == 500 and json.loads(raw)["error"]["type"] == "api_error" and b"secret" not in raw


def test_x_api_key_or_bearer():
    assert api_key_error(None, "k", x_api_key="k") is None
    assert api_key_error("Bearer k", "k") is None
    assert api_key_error("Bearer k", "k", x_api_key="wrong") is None  # either header may carry it
    for auth, x in ((None, None), (None, "wrong"), ("Bearer wrong", None), ("Basic k", "k\u00e9")):
        err = api_key_error(auth, "k", x_api_key=x)
        assert err is not None and err.status == 401
    assert api_key_error(None, None) is None  # no key configured
