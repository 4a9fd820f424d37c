"""Send one streaming completion request and measure it (TTFT, latency, tokens, cache).

Works with any OpenAI-compatible server: usage comes from the final usage chunk
(``stream_options.include_usage``), cached tokens from ``usage.prompt_tokens_details``,
falling back to llama-server's ``timings.cache_n``; the cache source from Arbor's
``arbor.cache.source`` extension when present. Failures are recorded, never raised.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass
class Measurement:
    """What one request produced; times are ``time.perf_counter()`` seconds."""

    started: float
    first_token: float | None = None
    finished: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    cached_tokens_from: str | None = None
    cache_source: str | None = None
    finish_reason: str | None = None
    status: int | None = None
    error: str | None = None


def _has_generated_output(choice: dict) -> bool:
    delta = choice.get("delta") or {}
    return bool(delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls")
                or choice.get("text"))


def _error_message(status: int, raw: bytes) -> str:
    """``HTTP <status>: <message>`` from an OpenAI-style error body, else the body's start."""
    message = None
    try:
        payload = json.loads(raw)
    except ValueError:
        payload = None
    if isinstance(payload, dict):
        error = payload.get("error")
        message = error.get("message") if isinstance(error, dict) else error or payload.get("detail")
    return f"HTTP {status}: {message or raw.decode('utf-8', 'replace')[:300]}"


class _Accumulator:
    """Folds the stream's chunks into usage, timings and cache fields."""

    def __init__(self, measurement: Measurement) -> None:
        self.m = measurement
        self.usage: dict | None = None
        self.timings: dict | None = None

    def feed(self, chunk: dict, now: float) -> None:
        if isinstance(chunk.get("error"), (dict, str)):
            error = chunk["error"]
            self.m.error = f"stream error: {error.get('message') if isinstance(error, dict) else error}"
            return
        for choice in chunk.get("choices") or []:
            if self.m.first_token is None and _has_generated_output(choice):
                self.m.first_token = now
            if choice.get("finish_reason"):
                self.m.finish_reason = choice["finish_reason"]
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        if chunk.get("timings"):
            self.timings = chunk["timings"]
        source = ((chunk.get("arbor") or {}).get("cache") or {}).get("source")
        if source is not None:
            self.m.cache_source = str(source)

    def finish(self) -> None:
        usage, timings = self.usage or {}, self.timings or {}
        details = usage.get("prompt_tokens_details") or {}
        if details.get("cached_tokens") is not None:
            self.m.cached_tokens, self.m.cached_tokens_from = int(details["cached_tokens"]), "usage"
        elif timings.get("cache_n") is not None:
            self.m.cached_tokens, self.m.cached_tokens_from = int(timings["cache_n"]), "timings"
        if usage.get("prompt_tokens") is not None:
            self.m.prompt_tokens = int(usage["prompt_tokens"])
        elif timings.get("prompt_n") is not None:
            self.m.prompt_tokens = int(timings["prompt_n"]) + int(timings.get("cache_n") or 0)
        if usage.get("completion_tokens") is not None:
            self.m.completion_tokens = int(usage["completion_tokens"])
        elif timings.get("predicted_n") is not None:
            self.m.completion_tokens = int(timings["predicted_n"])


async def send_streaming(client: httpx.AsyncClient, url: str, body: dict[str, Any],
                         headers: dict[str, str]) -> Measurement:
    """POST ``body`` (already prepared for streaming) to ``url`` and measure the answer."""
    m = Measurement(started=time.perf_counter())
    accumulator = _Accumulator(m)
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            m.status = response.status_code
            if response.status_code != 200:
                m.error = _error_message(response.status_code, await response.aread())
                return m
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    break
                try:
                    chunk = json.loads(data)
                except json.JSONDecodeError:
                    m.error = f"malformed stream chunk: {data[:120]!r}"
                    break
                accumulator.feed(chunk, time.perf_counter())
                if m.error:
                    break
        # A server that ignores stream_options.include_usage leaves the token fields None;
        # the summary counts such requests instead of guessing.
        accumulator.finish()
    except httpx.HTTPError as exc:
        m.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    finally:
        m.finished = time.perf_counter()
    return m
