"""A finished reply as a Messages API `message`: content blocks, stop reason, usage.

Blocks come in the order the model wrote them: `thinking` (the family parser's reasoning; its
`signature` is empty: nothing here signs), `text`, then one `tool_use` per call (ids as the
chat layer made them, which every template accepts back). The usage is the cache's accounting
(server.api.protocols.anthropic_messages.cache_control.PromptCache); `arbor` carries the same cache report as
the chat routes.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from server.api.engine_bridge.chat_layer import ParsedReply
from server.api.engine_bridge.generation import Collected
from server.api.engine_bridge.reply_stream import ReplyStream, ToolCall
from server.api.protocols.anthropic_messages.cache_control import PromptCache
from server.api.protocols.finish_report import arbor_extension
from server.engine.sequence import Finished


def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex[:24]}"


def tool_input(call: ToolCall) -> dict[str, Any]:
    """A call's arguments as the object Anthropic's `input` is (the reply stream keeps only
    calls whose arguments are a whole JSON object)."""
    value = json.loads(call.arguments or "{}")
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class StopReason:
    reason: str  # end_turn | max_tokens | stop_sequence | tool_use
    sequence: str | None = None  # the client's stop sequence that ended the reply


def stop_reason(fin: Finished, calls: list[ToolCall], stop_sequences: list[str]) -> StopReason:
    """Why the reply ended, in Anthropic's terms. A template's own end markers are stop strings
    too: only a match of one of the client's `stop_sequences` is `stop_sequence`."""
    if fin.finish_reason == "length":
        return StopReason("max_tokens")
    if calls:
        return StopReason("tool_use")
    if fin.stop_word is not None and fin.stop_word in stop_sequences:
        return StopReason("stop_sequence", fin.stop_word)
    return StopReason("end_turn")


def content_blocks(reply: ParsedReply, calls: list[ToolCall]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if reply.reasoning_content:
        blocks.append({"type": "thinking", "thinking": reply.reasoning_content, "signature": ""})
    if reply.content:
        blocks.append({"type": "text", "text": reply.content})
    blocks.extend({"type": "tool_use", "id": c.id, "name": c.name, "input": tool_input(c)} for c in calls)
    return blocks


def usage(fin: Finished, cache: PromptCache) -> dict[str, int]:
    return {**cache.usage(fin.prompt_tokens, fin.cached_tokens), "output_tokens": fin.completion_tokens}


def message(mid: str, model: str, reply: ParsedReply, calls: list[ToolCall], fin: Finished, stop: StopReason,
            cache: PromptCache) -> dict[str, Any]:
    return {"id": mid, "type": "message", "role": "assistant", "model": model,
            "content": content_blocks(reply, calls), "stop_reason": stop.reason, "stop_sequence": stop.sequence,
            "usage": usage(fin, cache), "arbor": arbor_extension(fin)}


def whole_message(mid: str, model: str, got: Collected, reader: ReplyStream, stop_sequences: list[str],
                  cache: PromptCache) -> dict[str, Any]:
    """The answer of a non-streamed request: its reply read by the family's parser (`reader`)."""
    reply = reader.read(got.text)
    calls = reader.calls
    return message(mid, model, reply, calls, got.fin, stop_reason(got.fin, calls, stop_sequences), cache)
