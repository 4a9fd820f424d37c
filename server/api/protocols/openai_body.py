"""What OpenAI's chat and text completion bodies share: the head (id, object, created, model,
system_fingerprint), the usage of the request's `n` choices, and the usage-only chunk of a stream."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from server.api.engine_bridge.reply_stream import ToolCall
from server.api.protocols.finish_report import arbor_extension, timings
from server.engine.sequence import Finished


@dataclass(frozen=True)
class ServedModel:
    """Who answers: the model name clients use and the build + model `system_fingerprint`."""

    name: str
    fingerprint: str


def head(rid: str, obj: str, created: int, model: ServedModel) -> dict[str, Any]:
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


@dataclass(frozen=True)
class ChoiceOut:
    """One finished choice of a non-streamed answer."""

    text: str
    fin: Finished
    calls: list[ToolCall] = field(default_factory=list)
    logprobs: Any = None  # in the endpoint's own shape (protocols.logprob_format), or None
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


def totals(fins: list[Finished]) -> dict[str, Any]:
    """`usage`, `timings` and `arbor` of the whole request (each choice's own under `arbor.choices`)."""
    total = request_totals(fins)
    arbor = arbor_extension(total)
    if len(fins) > 1:
        arbor["choices"] = [{"index": i, "cached_tokens": f.cached_tokens, "completion_tokens": f.completion_tokens,
                             **arbor_extension(f)}
                            for i, f in enumerate(fins)]
    return {"usage": usage(total), "timings": timings(total), "arbor": arbor}


def usage_chunk(rid: str, model: ServedModel, created: int, fins: list[Finished], obj: str) -> dict[str, Any]:
    """The last chunk of a stream that asked for `stream_options.include_usage`: no choices."""
    return {**head(rid, obj, created, model), "choices": [], **totals(fins)}
