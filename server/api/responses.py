"""OpenAI response bodies (and llama-server's `timings`, and Arbor's `arbor.cache`)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from server.api.engine_bridge.reply_stream import ToolCall
from server.api.http.errors import APIError
from server.engine.sequence import Finished


@dataclass(frozen=True)
class ServedModel:
    """Who answers: the model name clients use and the build + model `system_fingerprint`."""

    name: str
    fingerprint: str


def _head(rid: str, obj: str, created: int, model: ServedModel) -> dict[str, Any]:
    return {"id": rid, "object": obj, "created": created, "model": model.name,
            "system_fingerprint": model.fingerprint}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(fin: Finished) -> dict[str, Any]:
    return {
        "prompt_tokens": fin.prompt_tokens,
        "completion_tokens": fin.completion_tokens,
        "total_tokens": fin.prompt_tokens + fin.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": fin.cached_tokens},
    }


def timings(fin: Finished) -> dict[str, Any]:
    prompt_n = fin.prompt_tokens - fin.cached_tokens
    return {
        "cache_n": fin.cached_tokens,
        "prompt_n": prompt_n,
        "prompt_ms": round(fin.prompt_ms, 3),
        "prompt_per_second": prompt_n / (fin.prompt_ms / 1000.0) if fin.prompt_ms > 0 else 0.0,
        "predicted_n": fin.completion_tokens,
        "predicted_ms": round(fin.predicted_ms, 3),
        "predicted_per_second": fin.completion_tokens / (fin.predicted_ms / 1000.0) if fin.predicted_ms > 0 else 0.0,
    }


def arbor_extension(fin: Finished) -> dict[str, Any]:
    c = fin.cache
    return {
        "cache": {
            "source": c.source,
            "reused_tokens": c.reused_tokens,
            "restored_bytes": c.restored_bytes,
            "restore_ms": round(c.restore_ms, 3),
            "plan": c.plan,
            "est_ms": None if c.est_ms is None else round(c.est_ms, 3),
        }
    }


def finish_reason(fin: Finished, tool_calls: list[ToolCall]) -> str:
    if tool_calls and fin.finish_reason == "stop":
        return "tool_calls"
    return fin.finish_reason


@dataclass(frozen=True)
class ChoiceOut:
    """One finished choice of a non-streamed answer."""

    text: str
    fin: Finished
    calls: list[ToolCall] = field(default_factory=list)
    logprobs: Any = None  # in the endpoint's own shape (api.logprob_format), or None
    reasoning: str = ""  # the reply's reasoning, read apart by the family's parser


def request_totals(fins: list[Finished]) -> Finished:
    """The request-wide totals of its choices (OpenAI counts the prompt once): completion
    tokens add up; cached tokens are those every choice found cached, i.e. what was reused
    from before the request (a choice that attached to another's prefill reports its own
    count under `arbor.choices`)."""
    if len(fins) == 1:
        return fins[0]
    return replace(
        fins[0],
        cached_tokens=min(f.cached_tokens for f in fins),
        completion_tokens=sum(f.completion_tokens for f in fins),
        prompt_ms=max(f.prompt_ms for f in fins),
        predicted_ms=max(f.predicted_ms for f in fins),
    )


def _extras(fins: list[Finished]) -> dict[str, Any]:
    total = request_totals(fins)
    arbor = arbor_extension(total)
    if len(fins) > 1:
        arbor["choices"] = [{"index": i, "cached_tokens": f.cached_tokens, "completion_tokens": f.completion_tokens,
                             **arbor_extension(f)}
                            for i, f in enumerate(fins)]
    return {"usage": usage(total), "timings": timings(total), "arbor": arbor}


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
    return {**_head(rid, "chat.completion", int(time.time()), model), "choices": choices,
            **_extras([o.fin for o in outs])}


def chat_chunk(rid: str, model: ServedModel, created: int, delta: dict[str, Any], finish: str | None = None,
               extra: dict[str, Any] | None = None, index: int = 0, logprobs: Any = None) -> dict[str, Any]:
    body = {
        **_head(rid, "chat.completion.chunk", created, model),
        "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
    }
    if extra:
        body.update(extra)
    return body


def usage_chunk(rid: str, model: ServedModel, created: int, fins: list[Finished], obj: str) -> dict[str, Any]:
    return {**_head(rid, obj, created, model), "choices": [], **_extras(fins)}


def text_completion(rid: str, model: ServedModel, outs: list[ChoiceOut]) -> dict[str, Any]:
    choices = [{"index": i, "text": o.text, "logprobs": o.logprobs, "finish_reason": o.fin.finish_reason}
               for i, o in enumerate(outs)]
    return {**_head(rid, "text_completion", int(time.time()), model), "choices": choices,
            **_extras([o.fin for o in outs])}


def text_chunk(rid: str, model: ServedModel, created: int, text: str, finish: str | None = None,
               index: int = 0, logprobs: Any = None) -> dict[str, Any]:
    return {
        **_head(rid, "text_completion", created, model),
        "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}],
    }


def sse(data: dict[str, Any] | str) -> str:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload}\n\n"


TEXT_SLOT = "\x00"  # stands for the text in a body given to sse_with_text (JSON never emits it raw)


def sse_with_text(body: dict[str, Any]) -> Callable[[str], str]:
    """A renderer of `sse(body)` frames in which the one string value TEXT_SLOT is replaced by
    the given text. A stream's content chunks differ only in their text, so the rest is
    serialized once per stream instead of once per chunk; the frames are byte-identical."""
    head, tail = json.dumps(body, ensure_ascii=False).split(json.dumps(TEXT_SLOT))
    head, tail = "data: " + head, tail + "\n\n"
    return lambda text: head + json.dumps(text, ensure_ascii=False) + tail


def error_event(error: APIError) -> str:
    """An error inside an already started event stream (the HTTP status is already 200)."""
    return sse(error.body())
