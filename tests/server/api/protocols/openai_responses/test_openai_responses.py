"""OpenAI's Responses API without a model: the translation and the stream events, read back by the
`openai` client's own parser (the store: tests/server/api/http/test_response_store.py; the real
server: tests/server/api/test_responses_api.py)."""

from __future__ import annotations

import json

import openai
import pytest
from openai._models import construct_type
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import ResponseStreamEvent
from pydantic import ValidationError

from server.api.engine_bridge.chat_layer import EMPTY_REPLY, ParsedCall, ParsedReply
from server.api.engine_bridge.reply_stream import ContentDelta, ReasoningDelta, ReplyStream, ToolCall, ToolCallDelta
from server.api.http.errors import APIError
from server.api.http.response_store import StoredResponse
from server.api.protocols.openai_body import ServedModel
from server.api.protocols.openai_responses.events import ResponseEvents
from server.api.protocols.openai_responses.output import ResponseHead, reply_items
from server.api.protocols.openai_responses.request import ResponsesRequest
from server.api.protocols.openai_responses.translate import plan_response
from server.engine.sequence import CacheReport, Finished, TextDelta

MODEL = "SmolLM2-135M-Instruct.Q4_1"
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather of a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def _fin(reason: str = "stop", prompt: int = 10, cached: int = 0, completion: int = 3) -> Finished:
    return Finished(reason, prompt, cached, completion, 1.0, 1.0, CacheReport())


# --- the request and its translation ---

def test_items_become_one_conversation():
    body = ResponsesRequest.model_validate({
        "instructions": "Be brief.",
        "input": [
            {"role": "user", "content": "Weather?"},
            {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
            {"type": "function_call", "call_id": "abc123XYZ", "name": "get_weather", "arguments": '{"city":"Oslo"}'},
            {"type": "function_call_output", "call_id": "abc123XYZ", "output": "rain"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "And "},
                                                            {"type": "input_text", "text": "tomorrow?"}]},
        ],
        "tools": [WEATHER], "tool_choice": {"type": "function", "name": "get_weather"},
        "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}}},
        "max_output_tokens": 16, "prompt_cache_key": "conv-1", "reasoning": {"effort": "low"},
    })
    planned = plan_response(body, "resp_new", None, max_messages=100)
    chat = planned.chat
    assert [m.role for m in chat.messages] == ["system", "user", "assistant", "tool", "user"]
    answer = chat.messages[2]
    assert answer.content == "Let me look." and answer.reasoning_content == "hm"
    assert answer.tool_calls and answer.tool_calls[0].id == "abc123XYZ"
    assert chat.messages[4].content == "And tomorrow?"
    assert chat.tools and chat.tools[0].function.name == "get_weather"
    assert chat.tool_choice is not None and not isinstance(chat.tool_choice, str)
    assert chat.response_format and chat.response_format.json_schema
    assert chat.response_format.json_schema.schema_ == {"type": "object"}
    assert chat.max_tokens == 16 and chat.reasoning_effort == "low" and chat.parallel_tool_calls is True
    assert chat.continue_final_message is False  # a final assistant message is answered, not continued
    assert planned.session == "conv-1" and planned.root_id == "resp_new"


def test_a_stored_conversation_is_the_cache_session_and_the_prefix():
    first = ResponsesRequest.model_validate({"input": "Hi"})
    planned = plan_response(first, "resp_1", None, max_messages=100)
    assert planned.session == "resp_1"  # stored by default: the chain starts here
    assert plan_response(ResponsesRequest.model_validate({"input": "Hi", "store": False}), "resp_x", None,
                         100).session is None
    stored = StoredResponse("resp_1", "resp_1", None, planned.input_items, {
        "id": "resp_1", "output": [{"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "f",
                                    "arguments": "{}", "status": "completed"}]})
    follow = ResponsesRequest.model_validate({"previous_response_id": "resp_1", "store": False, "input": [
        {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "42"}]}]})
    planned2 = plan_response(follow, "resp_2", [stored], max_messages=100)
    assert planned2.session == "resp_1" and planned2.root_id == "resp_1"
    assert [m.role for m in planned2.chat.messages] == ["user", "assistant", "tool"]
    assert planned2.chat.messages[2].content == "42"
    with pytest.raises(APIError) as err:
        plan_response(follow, "resp_3", [stored], max_messages=2)
    assert err.value.param == "input" and "--max-messages" in err.value.message


def test_function_call_output_without_its_call_is_refused():
    body = ResponsesRequest.model_validate({"input": [
        {"role": "user", "content": "x"}, {"type": "function_call_output", "call_id": "nope", "output": "1"}]})
    with pytest.raises(APIError) as err:
        plan_response(body, "resp_1", None, max_messages=100)
    assert err.value.status == 400 and err.value.param == "input.1.call_id" and err.value.code == "unknown_call_id"


@pytest.mark.parametrize("body,needle", [
    ({"input": [{"type": "web_search_call", "id": "w"}]}, "unsupported input item type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input_image"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "function tools only"),
    ({"input": "x", "tool_choice": "required"}, "needs at least one tool"),
    ({"input": "x", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "other"}}, "not in tools"),
    ({"input": []}, "input must not be empty"),
    ({"input": "x", "background": True}, "background"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}}, "schema is required"),
    ({"input": "x", "prompt_cache_key": "a\nb"}, "control characters"),
])
def test_bad_requests_are_refused_with_a_reason(body, needle):
    with pytest.raises(ValidationError) as err:
        ResponsesRequest.model_validate(body)
    assert needle in str(err.value)


# --- output items and stream events, read back by the openai client's own parser ---

class _ScriptedReader(ReplyStream):
    """A reply reader that hands out given deltas (one list per feed), then given calls."""

    def __init__(self, script, calls):
        super().__init__(None)
        self._script = list(script)
        self._final_calls = calls

    def feed(self, delta):
        return self._script.pop(0)

    def finish(self):
        return self._script.pop(0) if self._script else []

    @property
    def calls(self):
        return self._final_calls


def _head(**request) -> ResponseHead:
    body = ResponsesRequest.model_validate({"input": "x", **request})
    chat = plan_response(body, "resp_t", None, 100).chat
    return ResponseHead.new("resp_t", ServedModel(MODEL, "fp_x"), body, chat)


def _parse(frames: str):
    """The events as the openai client's SSE reader and accumulator see them."""
    state = ResponseStreamState(input_tools=[], text_format=openai.omit)
    events = []
    for block in frames.strip().split("\n\n"):
        kind_line, data_line = block.split("\n")
        data = json.loads(data_line.removeprefix("data: "))
        assert kind_line == f"event: {data['type']}"
        events.extend(state.handle_event(construct_type(type_=ResponseStreamEvent, value=data)))
    return events


def test_stream_events_parse_with_the_openai_client():
    script = [
        [ReasoningDelta("think")],
        [ContentDelta("Hel"), ContentDelta("lo")],
        [ToolCallDelta(0, "", id="call1abcd", name="f"), ToolCallDelta(0, '{"a":')],
        [ToolCallDelta(0, "1}")],
        [],
    ]
    reader = _ScriptedReader(script, [ToolCall("call1abcd", "f", '{"a":1}')])
    kept: list[dict] = []
    events = ResponseEvents(_head(tools=[{**WEATHER, "name": "f"}]), reader, lambda t: len(t), kept.append)
    frames = events.opening() + "".join(events.delta(0, TextDelta("?", [], [])) for _ in range(4))
    tail = events.finish(0, _fin(completion=9))
    (body,) = kept  # the finished Response, handed over (to be stored) with the last frames
    parsed = _parse(frames + tail)
    kinds = [e.type for e in parsed]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in parsed] == list(range(len(parsed)))
    for kind in ("response.output_item.added", "response.content_part.added", "response.output_text.delta",
                 "response.output_text.done", "response.content_part.done", "response.function_call_arguments.delta",
                 "response.function_call_arguments.done", "response.output_item.done",
                 "response.reasoning_text.delta"):
        assert kind in kinds, kind
    final = parsed[-1].response
    assert [o.type for o in final.output] == ["reasoning", "message", "function_call"]
    assert final.output_text == "Hello"
    assert final.output[2].arguments == '{"a":1}' and final.output[2].call_id == "call1abcd"
    assert final.usage.output_tokens_details.reasoning_tokens == 5  # the counter given: characters
    assert body["status"] == "completed" and [o["id"] for o in body["output"]] == [o.id for o in final.output]


def test_stream_stopped_by_max_output_tokens_is_incomplete():
    reader = _ScriptedReader([[ContentDelta("Hi")], []], [])
    kept: list[dict] = []
    events = ResponseEvents(_head(max_output_tokens=1), reader, len, kept.append)
    frames = events.opening() + events.delta(0, TextDelta("Hi", [], []))
    tail = events.finish(0, _fin("length", completion=1))
    (body,) = kept
    parsed = _parse(frames + tail)
    assert parsed[-1].type == "response.incomplete"
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][0]["status"] == "incomplete"


def test_an_empty_reply_still_has_its_message():
    kept: list[dict] = []
    events = ResponseEvents(_head(), _ScriptedReader([[]], []), len, kept.append)
    frames = events.opening()
    tail = events.finish(0, _fin())
    (body,) = kept
    parsed = _parse(frames + tail)
    assert parsed[-1].response.output_text == "" and [o["type"] for o in body["output"]] == ["message"]


def test_whole_reply_items():
    reply = ParsedReply("ok", "why", (ParsedCall("f", "{}", ""),))
    items = reply_items(reply, [ToolCall("c1", "f", "{}")], _fin())
    assert [i["type"] for i in items] == ["reasoning", "message", "function_call"]
    assert items[2]["call_id"] == "c1"
    assert [i["type"] for i in reply_items(EMPTY_REPLY, [], _fin())] == ["message"]
    only_call = reply_items(ParsedReply("", "", ()), [ToolCall("c1", "f", "{}")], _fin())
    assert [i["type"] for i in only_call] == ["function_call"]
