"""The model adapter: chat completions over any OpenAI-compatible server, streamed.

It uses `openai.AsyncOpenAI` (base URL, key and timeout from the settings) and works
against arbor-server, llama-server, vLLM or SGLang. The request body is built here in one
place (`build_body`) so the exact body sent is also what the trace and the manifest store.

Cache hints (arbor-server's lifecycle extension, ignored by other servers) travel twice: as
the body extension ``"cache": {"session", "state"}`` and as ``X-Arbor-Session`` /
``X-Arbor-Cache-State`` headers. A model request always says ``active``: the model is being
called. What happens between requests (tools, an approval, the end of a turn) is told by the
hints that need no request (app/agent/cache_hints.py).

Failures become `ModelBackendError` with a readable message and a `kind`
(``unreachable``, ``timeout``, ``http_error``, ``bad_response``, ``context_exceeded``); the
turn fails with that message and can be retried. A request the server refuses as longer than
its context is an ``http_error`` whose `context_exceeded` is true (the agent then compacts
harder and retries once).
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import openai

from app.settings import WorkbenchSettings

TokenSink = Callable[[str], Awaitable[None] | None]


class ModelBackendError(RuntimeError):
    """The model backend is down, timed out, or answered with an error."""

    def __init__(self, message: str, kind: str, code: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.code = code  # the error's code (or type) in the server's answer, when it sent one

    @property
    def context_exceeded(self) -> bool:
        """The server refused the request as too long for its context (OpenAI's, vLLM's, llama-server's words)."""
        return self.code in ("context_length_exceeded", "exceed_context_size_error") or (
            self.kind == "http_error" and "maximum context length" in str(self))


@dataclass
class ModelCallResult:
    """One completed model call, assembled from the stream."""

    content: str = ""
    tool_calls: list[dict] = field(default_factory=list)
    reasoning: str = ""  # a thinking model's reasoning, which the server returns apart from the content
    finish_reason: str | None = None
    model: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    cache: dict | None = None  # the server's "arbor.cache" extension, when it sends one
    timings: dict | None = None  # llama-server style timings, when present
    ttft_ms: float | None = None
    duration_ms: float = 0.0
    # arbor-server's mark of a reply whose end cut a tool call off (its streamed arguments are
    # incomplete): the "arbor.truncated_tool_call" extension of the last chunk
    truncated_tool_call: bool = False
    # the W3C trace context sent with the request (OTLP export on: app/telemetry/otlp.py); the
    # server's span of the request is a child of the span it names
    traceparent: str | None = None

    @property
    def cut_tool_calls(self) -> bool:
        """Tool calls the end of the reply may have cut: generation stopped at `max_tokens`
        (finish_reason "length") after a call began, or the server says it cut one."""
        return self.truncated_tool_call or (self.finish_reason == "length" and bool(self.tool_calls))

    def assistant_message(self) -> dict:
        """The OpenAI assistant message this call adds to the conversation."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        if self.reasoning:
            # sent back with the history: the model's template decides what of it to keep
            message["reasoning_content"] = self.reasoning
        return message


class ModelAdapter:
    """Streams chat completions from the configured backend."""

    def __init__(self, settings: WorkbenchSettings) -> None:
        self.settings = settings
        self.base_url = settings.llm_base_url
        # No silent retries: a failed turn is reported and the user retries it.
        self.client = openai.AsyncOpenAI(base_url=settings.llm_base_url, api_key=settings.llm_api_key,
                                         timeout=settings.llm_timeout_s, max_retries=0)
        self._model: str | None = settings.llm_model or None

    async def close(self) -> None:
        await self.client.close()

    async def model_name(self) -> str:
        """LLM_MODEL, or the first model the backend lists when LLM_MODEL is empty."""
        if self._model is None:
            models = await self.list_models()
            if not models:
                raise ModelBackendError(f"model backend at {self.base_url} lists no models; set LLM_MODEL",
                                        "bad_response")
            self._model = models[0]
        return self._model

    async def list_models(self) -> list[str]:
        try:
            page = await self.client.models.list()
        except openai.OpenAIError as exc:
            raise self._translate(exc) from None
        return [m.id for m in page.data]

    def build_body(self, model: str, messages: list[dict], tools: list[dict], tool_choice: Any,
                   cache_session: str | None, max_tokens: int | None = None) -> dict:
        """The exact request body of one model step (`max_tokens` defaults to LLM_MAX_TOKENS;
        no cache hint without a `cache_session`)."""
        body: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": max_tokens or self.settings.llm_max_tokens,
        }
        if self.settings.llm_temperature is not None:
            body["temperature"] = self.settings.llm_temperature
        if tools:
            body["tools"] = tools
            if tool_choice is not None:
                body["tool_choice"] = tool_choice
        if cache_session:
            body["cache"] = {"session": cache_session, "state": "active"}
        return body

    @staticmethod
    def hint_headers(body: dict) -> dict[str, str]:
        hint = body.get("cache") or {}
        if not hint:
            return {}
        return {"X-Arbor-Session": str(hint["session"]), "X-Arbor-Cache-State": str(hint["state"])}

    async def stream(self, body: dict, on_token: TokenSink | None = None,
                     traceparent: str | None = None) -> ModelCallResult:
        """Send `body` (streaming) and assemble the answer; tokens go to `on_token` as they come.
        `traceparent` (W3C trace context) goes with the request as its header."""
        standard = {k: v for k, v in body.items() if k != "cache"}
        extra_body = {"cache": body["cache"]} if "cache" in body else None
        headers = self.hint_headers(body) | ({"traceparent": traceparent} if traceparent else {})
        result = ModelCallResult(traceparent=traceparent)
        calls: dict[int, dict] = {}
        start = time.perf_counter()
        stream = None
        try:
            stream = await self.client.chat.completions.create(
                **standard, extra_body=extra_body, extra_headers=headers)
            async for chunk in stream:
                data = chunk.model_dump(exclude_unset=True)
                self._absorb_extras(result, data)
                for choice in data.get("choices") or []:
                    delta = choice.get("delta") or {}
                    text = delta.get("content")
                    result.reasoning += delta.get("reasoning_content") or ""
                    if text or delta.get("tool_calls") or delta.get("reasoning_content"):
                        if result.ttft_ms is None:
                            result.ttft_ms = (time.perf_counter() - start) * 1000
                    if text:
                        result.content += text
                        if on_token is not None:
                            maybe = on_token(text)
                            if maybe is not None:
                                await maybe
                    for piece in delta.get("tool_calls") or []:
                        self._merge_tool_call(calls, piece)
                    if choice.get("finish_reason"):
                        result.finish_reason = choice["finish_reason"]
        except openai.OpenAIError as exc:
            raise self._translate(exc) from None
        finally:
            if stream is not None:
                # A cancelled turn (or any early exit) closes the HTTP request now, not when the
                # garbage collector gets to it: the server stops generating and frees the slot.
                await stream.close()
        result.duration_ms = (time.perf_counter() - start) * 1000
        result.tool_calls = [self._finish_call(calls[i], i) for i in sorted(calls)]
        return result

    # -- helpers --------------------------------------------------------------------------
    @staticmethod
    def _absorb_extras(result: ModelCallResult, data: dict) -> None:
        result.model = data.get("model") or result.model
        usage = data.get("usage")
        if usage:
            result.prompt_tokens = usage.get("prompt_tokens")
            result.completion_tokens = usage.get("completion_tokens")
            details = usage.get("prompt_tokens_details") or {}
            if details.get("cached_tokens") is not None:
                result.cached_tokens = details["cached_tokens"]
        if data.get("timings"):
            result.timings = data["timings"]
            if result.cached_tokens is None and "cache_n" in data["timings"]:
                result.cached_tokens = data["timings"]["cache_n"]
        arbor = data.get("arbor")
        if isinstance(arbor, dict) and isinstance(arbor.get("cache"), dict):
            result.cache = arbor["cache"]
        if isinstance(arbor, dict) and arbor.get("truncated_tool_call") is True:
            result.truncated_tool_call = True

    @staticmethod
    def _merge_tool_call(calls: dict[int, dict], piece: dict) -> None:
        index = piece.get("index", 0)
        call = calls.setdefault(index, {"id": None, "name": "", "arguments": ""})
        if piece.get("id"):
            call["id"] = piece["id"]
        function = piece.get("function") or {}
        if function.get("name"):
            call["name"] += function["name"]
        if function.get("arguments"):
            call["arguments"] += function["arguments"]

    @staticmethod
    def _finish_call(call: dict, index: int) -> dict:
        # Some servers send no id; the conversation needs one to pair the tool result.
        call_id = call["id"] or f"call_{index}_{int(time.time() * 1000) % 10_000_000}"
        return {"id": call_id, "type": "function",
                "function": {"name": call["name"], "arguments": call["arguments"] or "{}"}}

    def _translate(self, exc: Exception) -> ModelBackendError:
        if isinstance(exc, openai.APITimeoutError):
            return ModelBackendError(
                f"model backend at {self.base_url} timed out after {self.settings.llm_timeout_s:g} s", "timeout")
        if isinstance(exc, openai.APIConnectionError):
            cause = exc.__cause__ or exc
            return ModelBackendError(f"model backend unreachable at {self.base_url}: {cause}", "unreachable")
        if isinstance(exc, openai.APIStatusError):
            detail = _error_detail(exc)
            return ModelBackendError(
                f"model backend at {self.base_url} answered HTTP {exc.status_code}: {detail}", "http_error",
                _error_code(exc))
        return ModelBackendError(f"model backend at {self.base_url} sent an unusable response: {exc}",
                                 "bad_response")


def _error_code(exc: openai.APIStatusError) -> str | None:
    body = exc.body
    inner = body.get("error", body) if isinstance(body, dict) else None
    if not isinstance(inner, dict):
        return None
    code = inner.get("code") if isinstance(inner.get("code"), str) else inner.get("type")
    return code if isinstance(code, str) else None


def _error_detail(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
    try:
        return json.dumps(body)[:500] if body is not None else exc.message
    except (TypeError, ValueError):
        return exc.message
