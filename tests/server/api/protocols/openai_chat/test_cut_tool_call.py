"""A streamed tool call the reply's end cut off (issue 59, item 4): its name and the arguments so
far have been streamed and cannot be taken back, so the choice's last chunk marks it, with
finish_reason "length" when max_tokens cut it and `arbor.truncated_tool_call`; a whole call
carries no mark, and a whole (non-streamed) answer leaves the cut call out. With llama.cpp's
own parser (the qwen3 template's Hermes format), no model."""

from __future__ import annotations

import json

from harness.models.family_model import FAMILIES, template_text
from server.api.engine_bridge.chat_layer import ChatTemplates, ReplyParser
from server.api.engine_bridge.reply_stream import ReplyStream
from server.api.protocols.openai_body import ServedModel
from server.api.protocols.openai_chat.stream import ChatChoiceStream
from server.engine.sequence import CacheReport, Finished, TextDelta

ASK = [{"role": "user", "content": "Weather in Paris?"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def _stream() -> ChatChoiceStream:
    plan = ChatTemplates(None, template_text(FAMILIES["qwen3"].template)).apply({"messages": ASK, "tools": [WEATHER]})
    reader = ReplyStream(ReplyParser(plan, reasoning_format="auto", parse_tool_calls=True))
    return ChatChoiceStream("r1", ServedModel("m", "fp"), 0, 0, reader, None)


def _chunks(frames: str) -> list[dict]:
    return [json.loads(line[6:]) for line in frames.splitlines() if line.startswith("data: {")]


def _run(text: str, reason: str) -> tuple[dict, list[dict]]:
    stream = _stream()
    frames = "".join(stream.delta(TextDelta(ch, [], [])) for ch in text)
    frames += stream.finish(Finished(reason, 5, 0, 2, 1.0, 1.0, CacheReport()))
    chunks = _chunks(frames)
    calls: dict[int, str] = {}
    for chunk in chunks:
        for piece in chunk["choices"][0]["delta"].get("tool_calls") or []:
            calls[piece["index"]] = calls.get(piece["index"], "") + piece["function"]["arguments"]
    return chunks[-1], [{"arguments": a} for _, a in sorted(calls.items())]


def test_a_streamed_call_cut_by_max_tokens_is_marked():
    last, calls = _run('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par', "length")
    assert calls, "the call's start was streamed before the cut"
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["arbor"]["truncated_tool_call"] is True


def test_a_whole_call_is_not_marked():
    last, calls = _run('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', "stop")
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris"}
    assert last["choices"][0]["finish_reason"] == "tool_calls"
    assert "truncated_tool_call" not in last["arbor"]
