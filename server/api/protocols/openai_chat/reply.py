"""A chat completion's answer: the whole body (`chat.completion`) and the chunk every streamed
frame is (`chat.completion.chunk`), with llama-server's `timings` and Arbor's `arbor` extension."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from server.api.engine_bridge.generation import Collected
from server.api.engine_bridge.reply_stream import ReplyStream, ToolCall
from server.api.protocols.logprob_format import Piece, chat_logprobs
from server.api.protocols.openai_body import ChoiceOut, ServedModel, head, totals
from server.engine.sequence import Finished


def finish_reason(fin: Finished, tool_calls: list[ToolCall]) -> str:
    if tool_calls and fin.finish_reason == "stop":
        return "tool_calls"
    return fin.finish_reason


def chat_choice(got: Collected, reader: ReplyStream, piece: Piece | None) -> ChoiceOut:
    """One whole choice: its reply read by the family's parser (`reader`), its log-probabilities
    when asked for (`piece` set)."""
    logprobs = chat_logprobs(got.logprobs, piece) if piece is not None else None
    reply = reader.read(got.text)
    return ChoiceOut(reply.content, got.fin, reader.calls, logprobs, reply.reasoning_content)


def whole_chat_completion(rid: str, model: ServedModel, got: list[Collected], reader: Callable[[], ReplyStream],
                          piece: Piece | None) -> dict[str, Any]:
    """The answer of a non-streamed request: each choice read by a reader of its own."""
    return chat_completion(rid, model, [chat_choice(c, reader(), piece) for c in got])


def chat_completion(rid: str, model: ServedModel, outs: list[ChoiceOut]) -> dict[str, Any]:
    choices = []
    for i, out in enumerate(outs):
        message: dict[str, Any] = {"role": "assistant", "content": out.text if out.text or not out.calls else None}
        if out.reasoning:
            message["reasoning_content"] = out.reasoning
        if out.calls:
            message["tool_calls"] = [c.as_openai() for c in out.calls]
        choices.append({"index": i, "message": message, "logprobs": out.logprobs,
                        "finish_reason": finish_reason(out.fin, out.calls)})
    return {**head(rid, "chat.completion", int(time.time()), model), "choices": choices,
            **totals([o.fin for o in outs])}


def chat_chunk(rid: str, model: ServedModel, created: int, delta: dict[str, Any], finish: str | None = None,
               extra: dict[str, Any] | None = None, index: int = 0, logprobs: Any = None) -> dict[str, Any]:
    body = {
        **head(rid, "chat.completion.chunk", created, model),
        "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
    }
    if extra:
        body.update(extra)
    return body
