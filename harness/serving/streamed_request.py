"""Send one streaming request and measure it (TTFT, latency, tokens, cache), in any of the
three APIs a manifest line may name.

- Chat Completions (any OpenAI-compatible server): TTFT at the first chunk with content,
  reasoning or a tool call; usage from the final usage chunk (``stream_options.include_usage``),
  cached tokens from ``usage.prompt_tokens_details.cached_tokens``, falling back to
  llama-server's ``timings.cache_n``.
- Responses: TTFT at the first text, reasoning or arguments delta, or the
  ``response.output_item.added`` of a function call (where chat streams the call's name);
  usage from the Response of ``response.completed`` / ``response.incomplete``: ``input_tokens``,
  ``input_tokens_details.cached_tokens``, ``output_tokens``.
- Messages: TTFT at the first ``content_block_delta`` or the ``content_block_start`` of a
  ``tool_use`` block; usage from ``message_start`` overwritten by ``message_delta``'s
  cumulative totals: prompt tokens are ``input_tokens + cache_read_input_tokens +
  cache_creation_input_tokens`` (Anthropic's ``input_tokens`` counts only what was neither
  read nor written), cached tokens ``cache_read_input_tokens``.

``finish_reason`` is given in chat's words for all three (stop, length, tool_calls); the cache
source from Arbor's ``arbor.cache.source`` extension when present. Failures are recorded,
never raised.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import httpx

from harness.serving import sse


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
    """Folds a chat stream's chunks into usage, timings and cache fields."""

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


def _source(extension: Any) -> str | None:
    source = ((extension or {}).get("cache") or {}).get("source") if isinstance(extension, dict) else None
    return None if source is None else str(source)


#: Responses events whose arrival is the first generated output (chat's first content delta)
_RESPONSES_OUTPUT = {"response.output_text.delta", "response.reasoning_text.delta",
                     "response.reasoning_summary_text.delta", "response.refusal.delta",
                     "response.function_call_arguments.delta"}
_RESPONSES_REASONS = {"max_output_tokens": "length", "content_filter": "content_filter"}


class _ResponsesAccumulator:
    """Folds a Responses stream's events (each JSON object names its ``type``)."""

    def __init__(self, measurement: Measurement) -> None:
        self.m = measurement
        self.response: dict | None = None

    def feed(self, event: dict, now: float) -> None:
        kind = event.get("type")
        if kind == "error":
            self.m.error = f"stream error: {event.get('message') or event.get('error')}"
            return
        if kind == "response.failed":
            error = (event.get("response") or {}).get("error") or {}
            self.m.error = f"stream error: {error.get('message') if isinstance(error, dict) else error}"
            return
        if self.m.first_token is None and (kind in _RESPONSES_OUTPUT or (
                kind == "response.output_item.added" and (event.get("item") or {}).get("type") == "function_call")):
            self.m.first_token = now
        if kind in ("response.completed", "response.incomplete") and isinstance(event.get("response"), dict):
            self.response = event["response"]

    def finish(self) -> None:
        response = self.response or {}
        usage = response.get("usage") or {}
        if usage.get("input_tokens") is not None:
            self.m.prompt_tokens = int(usage["input_tokens"])
        if usage.get("output_tokens") is not None:
            self.m.completion_tokens = int(usage["output_tokens"])
        cached = (usage.get("input_tokens_details") or {}).get("cached_tokens")
        if cached is not None:
            self.m.cached_tokens, self.m.cached_tokens_from = int(cached), "usage"
        if response.get("status") == "incomplete":
            reason = str((response.get("incomplete_details") or {}).get("reason"))
            self.m.finish_reason = _RESPONSES_REASONS.get(reason, reason)
        elif response.get("status") == "completed":
            calls = any(isinstance(i, dict) and i.get("type") == "function_call" for i in response.get("output") or [])
            self.m.finish_reason = "tool_calls" if calls else "stop"
        self.m.cache_source = _source(response.get("arbor")) or self.m.cache_source


_MESSAGES_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls",
                     "refusal": "content_filter"}


class _MessagesAccumulator:
    """Folds an Anthropic Messages stream's events (each JSON object names its ``type``)."""

    def __init__(self, measurement: Measurement) -> None:
        self.m = measurement
        self.usage: dict = {}

    def feed(self, event: dict, now: float) -> None:
        kind = event.get("type")
        if kind == "error":
            error = event.get("error")
            self.m.error = f"stream error: {error.get('message') if isinstance(error, dict) else error}"
            return
        if kind == "message_start":
            self.usage.update((event.get("message") or {}).get("usage") or {})
        elif kind == "content_block_delta" or (
                kind == "content_block_start" and (event.get("content_block") or {}).get("type") == "tool_use"):
            if self.m.first_token is None:
                self.m.first_token = now
        elif kind == "message_delta":
            self.usage.update(event.get("usage") or {})  # cumulative totals
            reason = (event.get("delta") or {}).get("stop_reason")
            if reason is not None:
                self.m.finish_reason = _MESSAGES_REASONS.get(reason, reason)
            self.m.cache_source = _source(event.get("arbor")) or self.m.cache_source

    def finish(self) -> None:
        usage = self.usage
        if usage.get("input_tokens") is not None:
            read = int(usage.get("cache_read_input_tokens") or 0)
            written = int(usage.get("cache_creation_input_tokens") or 0)
            self.m.prompt_tokens = int(usage["input_tokens"]) + read + written
            self.m.cached_tokens, self.m.cached_tokens_from = read, "usage"
        if usage.get("output_tokens") is not None:
            self.m.completion_tokens = int(usage["output_tokens"])


def accumulator_for(api: str, m: Measurement) -> _Accumulator | _ResponsesAccumulator | _MessagesAccumulator:
    """What folds a stream of ``api``'s events into ``m``: ``feed(event, now)`` for each JSON event,
    then ``finish()`` once for the usage fields (chat for any name but responses and messages)."""
    if api == "responses":
        return _ResponsesAccumulator(m)
    if api == "messages":
        return _MessagesAccumulator(m)
    return _Accumulator(m)


async def send_streaming(client: httpx.AsyncClient, url: str, body: dict[str, Any],
                         headers: dict[str, str], api: str = "chat") -> Measurement:
    """POST ``body`` (already prepared for streaming) to ``url`` and measure the answer, read as
    a stream of ``api`` (chat, responses or messages)."""
    m = Measurement(started=time.perf_counter())
    accumulator = accumulator_for(api, m)
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            m.status = response.status_code
            if response.status_code != 200:
                m.error = _error_message(response.status_code, await response.aread())
                return m
            async for line in response.aiter_lines():
                data = sse.data_of(line)
                if data is None:
                    continue
                if data == sse.DONE:
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
