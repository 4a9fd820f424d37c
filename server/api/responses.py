"""OpenAI response bodies (and llama-server's `timings`, and Arbor's `arbor.cache`)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from server.api.errors import APIError
from server.api.tool_calls import ParsedToolCall
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


def finish_reason(fin: Finished, tool_calls: list[ParsedToolCall]) -> str:
    if tool_calls and fin.finish_reason == "stop":
        return "tool_calls"
    return fin.finish_reason


def _extras(fin: Finished) -> dict[str, Any]:
    return {"usage": usage(fin), "timings": timings(fin), "arbor": arbor_extension(fin)}


def chat_completion(rid: str, model: ServedModel, content: str, calls: list[ParsedToolCall],
                    fin: Finished) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content if content or not calls else None}
    if calls:
        message["tool_calls"] = [c.as_openai() for c in calls]
    return {
        **_head(rid, "chat.completion", int(time.time()), model),
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason(fin, calls)}],
        **_extras(fin),
    }


def chat_chunk(rid: str, model: ServedModel, created: int, delta: dict[str, Any], finish: str | None = None,
               extra: dict[str, Any] | None = None) -> dict[str, Any]:
    body = {
        **_head(rid, "chat.completion.chunk", created, model),
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    if extra:
        body.update(extra)
    return body


def usage_chunk(rid: str, model: ServedModel, created: int, fin: Finished, obj: str) -> dict[str, Any]:
    return {**_head(rid, obj, created, model), "choices": [], **_extras(fin)}


def text_completion(rid: str, model: ServedModel, text: str, fin: Finished) -> dict[str, Any]:
    return {
        **_head(rid, "text_completion", int(time.time()), model),
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": fin.finish_reason}],
        **_extras(fin),
    }


def text_chunk(rid: str, model: ServedModel, created: int, text: str, finish: str | None = None) -> dict[str, Any]:
    return {
        **_head(rid, "text_completion", created, model),
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
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
