"""A scripted OpenAI-compatible chat server for tests, served over real HTTP.

The fake answers ``POST /v1/chat/completions`` with replies the test scripts in advance
(a list consumed in order, or a function of the request body), so graph and API tests
exercise the real ``openai`` client, real sockets and real SSE parsing without a model.

Usage::

    from tests.fakes.scripted_openai import ScriptedOpenAI, ScriptedReply, tool_call

    with ScriptedOpenAI([
        ScriptedReply(tool_calls=[tool_call("list_companies", {})]),
        ScriptedReply(content="Three companies.", cached_tokens=12, cache_source="S"),
    ]) as fake:
        client = openai.OpenAI(base_url=fake.base_url, api_key="x")
        ...
        assert fake.requests[0]["body"]["messages"][0]["role"] == "system"

Contract of the responses (mirrors arbor-server, see the helper brief):
- ``usage.prompt_tokens_details.cached_tokens`` is the reply's ``cached_tokens``;
- a llama-server style ``timings`` object is present;
- ``"arbor": {"cache": {"source", "reused_tokens", "restored_bytes", "restore_ms"}}`` is
  present only when the reply sets ``cache_source`` (other servers do not send it);
- streaming sends one chunk per word of content, tool calls as deltas (name first, then the
  arguments in two pieces), a finish chunk, and a usage chunk when
  ``stream_options.include_usage`` is true, then ``data: [DONE]``;
- with ``token_delay_s`` each streamed chunk waits that long first; a stream the client closes
  before its end is counted in ``aborted``;
- ``status`` other than 200 answers an OpenAI-style error body with that status;
- ``finish_reason`` overrides the finish reason ("length": a reply cut by max_tokens, its tool
  call arguments as scripted, even cut), ``truncated_tool_call`` adds arbor-server's mark;
- an exhausted reply list answers 500 with a message saying so (the test then fails loudly);
- ``POST /cache/hint`` (arbor-server's bare lifecycle hint) is checked with the server's own
  parser and recorded in ``hints``; ``timeline`` holds ``("chat", body["cache"])`` and
  ``("hint", hint)`` in arrival order; with ``hint_endpoint=False`` it answers 404 like a
  server without it;
- with ``n_ctx`` set, the fake has a context like arbor-server: ``GET /props`` reports it
  (``default_generation_settings.n_ctx``; with ``limit_via="models"`` it is ``max_model_len`` of
  ``GET /v1/models`` instead, as vLLM reports it), and a request whose prompt tokens +
  ``max_tokens`` exceed it answers 400 ``context_length_exceeded`` naming the prompt's tokens.
  Prompt tokens are ``len(json.dumps(messages)) / chars_per_token`` (default 4), the tools'
  schemas included with ``count_tools``.

``requests`` holds one dict per chat request: ``{"body": <json>, "headers": {lower-case: value}}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from harness.serving.ports import free_port
from server.api.http.cache_fields import CacheHintError, parse_cache_hint

MODEL_ID = "scripted-fake"


@dataclass
class ScriptedReply:
    """One scripted answer. ``tool_calls`` items are OpenAI tool calls (see :func:`tool_call`)."""

    content: str = ""
    tool_calls: list[dict] | None = None
    reasoning: str = ""  # a thinking model's reasoning, sent as reasoning_content (before the content)
    delay_s: float = 0.0
    token_delay_s: float = 0.0  # a pause before each streamed chunk: a slow generation to stop
    cached_tokens: int = 0
    cache_source: str | None = None
    status: int = 200
    finish_reason: str | None = None  # None: "tool_calls" with tool calls, else "stop"; e.g. "length" (a cut reply)
    truncated_tool_call: bool = False  # arbor-server's mark of a call the reply's end cut (arbor.truncated_tool_call)

    @property
    def finish(self) -> str:
        return self.finish_reason or ("tool_calls" if self.tool_calls else "stop")


def tool_call(name: str, arguments: dict | str, call_id: str | None = None) -> dict:
    """Build an OpenAI tool call dict; ``arguments`` may be a dict or a raw (even invalid) string."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {
        "id": call_id or f"call_{uuid.uuid4().hex[:12]}",
        "type": "function",
        "function": {"name": name, "arguments": args},
    }


def _prompt_tokens(body: dict, chars_per_token: float = 4.0, count_tools: bool = False) -> int:
    # A deterministic stand-in for tokenization: roughly four characters per token.
    text = json.dumps(body.get("messages", [])) + (json.dumps(body.get("tools") or []) if count_tools else "")
    return max(1, int(len(text) / chars_per_token))


def _completion_tokens(reply: ScriptedReply) -> int:
    return len(reply.content.split()) + 8 * len(reply.tool_calls or [])


@dataclass
class ScriptedOpenAI:
    """The fake server. Start with ``start()`` or use it as a context manager."""

    replies: list[ScriptedReply] | Callable[[dict], ScriptedReply]
    requests: list[dict] = field(default_factory=list)
    host: str = "127.0.0.1"
    port: int = 0
    n_ctx: int | None = None  # tokens one request may hold; None: no limit, no /props
    limit_via: str = "props"  # where n_ctx is reported: "props" | "models"
    chars_per_token: float = 4.0  # the fake's tokenizer (tests may change it between requests)
    count_tools: bool = False  # the prompt's tokens include the tools' schemas, as a real server's do
    hint_endpoint: bool = True
    hint_refusals: int = 0  # hints answered 404 because hint_endpoint is False
    hints: list[dict] = field(default_factory=list)
    timeline: list[tuple[str, dict | None]] = field(default_factory=list)
    aborted: int = 0  # streams the client closed before their end (a cancelled turn's request)

    def __post_init__(self) -> None:
        self._queue = None if callable(self.replies) else list(self.replies)
        self._lock = threading.Lock()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.app = self._build_app()

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> ScriptedOpenAI:
        if not self.port:
            self.port = free_port()
        config = uvicorn.Config(self.app, host=self.host, port=self.port, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="scripted-openai", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"scripted OpenAI fake did not start on port {self.port}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = self._thread = None

    def __enter__(self) -> ScriptedOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def bodies(self) -> list[dict]:
        """Just the JSON bodies of the chat requests received so far."""
        return [r["body"] for r in self.requests]

    # -- behaviour ------------------------------------------------------------------------
    def _next_reply(self, body: dict) -> ScriptedReply | None:
        if self._queue is None:
            return self.replies(body)  # type: ignore[operator]
        with self._lock:
            return self._queue.pop(0) if self._queue else None

    def _build_app(self) -> FastAPI:
        app = FastAPI(title="scripted OpenAI fake")

        @app.get("/health")
        async def health() -> dict:
            return {"status": "ok"}

        @app.get("/v1/models")
        async def models() -> dict:
            entry: dict[str, Any] = {"id": MODEL_ID, "object": "model", "owned_by": "tests"}
            if self.n_ctx and self.limit_via == "models":
                entry["max_model_len"] = self.n_ctx
            return {"object": "list", "data": [entry]}

        @app.get("/props")
        async def props():
            if not self.n_ctx or self.limit_via != "props":
                return _error(404, "File Not Found")
            return {"total_slots": 1, "default_generation_settings": {"n_ctx": self.n_ctx}}

        @app.post("/cache/hint")
        async def cache_hint(request: Request):
            if not self.hint_endpoint:
                self.hint_refusals += 1
                return _error(404, "File Not Found")
            body = await request.json()
            try:
                parsed = parse_cache_hint({"cache": body}, None)
            except CacheHintError as exc:
                return _error(400, str(exc))
            if parsed.session is None:
                return _error(400, "a hint needs a session")
            self.hints.append(body)
            self.timeline.append(("hint", body))
            return {"session": parsed.session, "recorded": True}

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            body = await request.json()
            self.requests.append({"body": body, "headers": {k.lower(): v for k, v in request.headers.items()}})
            self.timeline.append(("chat", body.get("cache")))
            prompt = _prompt_tokens(body, self.chars_per_token, self.count_tools)
            if self.n_ctx and prompt + (body.get("max_tokens") or 0) > self.n_ctx:
                return _error(400, f"max_tokens={body.get('max_tokens')} does not fit: the prompt has {prompt} "
                                   f"tokens and a request holds {self.n_ctx}", code="context_length_exceeded")
            reply = self._next_reply(body)
            if reply is None:
                return _error(500, "scripted OpenAI fake: no scripted reply left for this request")
            if reply.delay_s:
                await asyncio.sleep(reply.delay_s)
            if reply.status != 200:
                return _error(reply.status, f"scripted failure with status {reply.status}")
            extras = _extras(prompt, reply)
            if body.get("stream"):
                include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                return StreamingResponse(self._counted(_stream(reply, extras, include_usage), reply.token_delay_s),
                                         media_type="text/event-stream")
            return JSONResponse(_completion(reply, extras))

        return app

    async def _counted(self, chunks: Iterator[str], delay_s: float):
        """The chunks, `delay_s` apart; a stream the client leaves before its end counts in `aborted`."""
        finished = False
        try:
            for chunk in chunks:
                if delay_s:
                    await asyncio.sleep(delay_s)
                yield chunk
            finished = True
        finally:
            if not finished:
                self.aborted += 1


def _error(status: int, message: str, code: str | int | None = None) -> JSONResponse:
    return JSONResponse(
        status_code=status,
        content={"error": {"message": message, "type": "server_error" if status >= 500 else "invalid_request_error",
                           "code": code or status}},
    )


def _extras(prompt: int, reply: ScriptedReply) -> dict:
    """usage, timings and the optional arbor.cache extension shared by both response shapes."""
    cached = min(reply.cached_tokens, prompt)
    completion = _completion_tokens(reply)
    extras: dict[str, Any] = {
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        },
        "timings": {"cache_n": cached, "prompt_n": prompt - cached, "prompt_ms": 1.0,
                    "predicted_n": completion, "predicted_ms": 1.0},
    }
    if reply.cache_source is not None:
        extras["arbor"] = {"cache": {"source": reply.cache_source, "reused_tokens": cached,
                                     "restored_bytes": 0, "restore_ms": 0.0}}
    if reply.truncated_tool_call:
        extras.setdefault("arbor", {})["truncated_tool_call"] = True
    return extras


def _completion(reply: ScriptedReply, extras: dict) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content or None}
    if reply.reasoning:
        message["reasoning_content"] = reply.reasoning
    if reply.tool_calls:
        message["tool_calls"] = reply.tool_calls
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": MODEL_ID,
        "choices": [{"index": 0, "message": message, "finish_reason": reply.finish}],
        **extras,
    }


def _stream(reply: ScriptedReply, extras: dict, include_usage: bool) -> Iterator[str]:
    base = {"id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": MODEL_ID}

    def chunk(delta: dict, finish: str | None = None, **more: Any) -> str:
        payload = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **more}
        return f"data: {json.dumps(payload)}\n\n"

    yield chunk({"role": "assistant", "content": ""})
    for i, word in enumerate(reply.reasoning.split(" ") if reply.reasoning else []):
        yield chunk({"reasoning_content": word if i == 0 else " " + word})
    words = reply.content.split(" ") if reply.content else []
    for i, word in enumerate(words):
        yield chunk({"content": word if i == 0 else " " + word})
    for index, call in enumerate(reply.tool_calls or []):
        args = call["function"]["arguments"]
        half = len(args) // 2
        yield chunk({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                     "function": {"name": call["function"]["name"], "arguments": ""}}]})
        for piece in (args[:half], args[half:]):
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    finish = reply.finish
    final_extras = {k: v for k, v in extras.items() if k != "usage"}
    yield chunk({}, finish, **final_extras)
    if include_usage:
        yield f"data: {json.dumps({**base, 'choices': [], **extras})}\n\n"
    yield "data: [DONE]\n\n"


@contextlib.contextmanager
def scripted_server(replies: list[ScriptedReply] | Callable[[dict], ScriptedReply]) -> Iterator[ScriptedOpenAI]:
    """Context manager for tests: ``with scripted_server([...]) as fake: ... fake.base_url``."""
    fake = ScriptedOpenAI(replies)
    fake.start()
    try:
        yield fake
    finally:
        fake.stop()
