"""``arbor replay record``: a recording proxy that captures a client's session as a manifest.

    arbor replay record --upstream http://127.0.0.1:8080 --out session.jsonl [--host 127.0.0.1] [--port 8089]

Point Codex (``OPENAI_BASE_URL=http://127.0.0.1:8089/v1``), Claude Code
(``ANTHROPIC_BASE_URL=http://127.0.0.1:8089``), the workbench or any client at the proxy: every
request is passed to ``--upstream`` and its answer back unchanged (streamed as it comes), and
each answered ``POST`` to ``/v1/chat/completions``, ``/v1/responses`` or ``/v1/messages`` becomes
one manifest line (harness/manifest.py): its API, the body exactly as the client sent it, ``t`` since
the proxy started, and the output tokens the answer reports (each API's usage, streamed or not).
The file is rewritten in arrival order after every answer, so it is whole whenever the proxy stops.
Requests that fail (no answer, or not 200) are left out, as the workbench's manifests leave them.

A request that brings tool results back (chat: its last message is a ``tool`` message; Responses: its
last input item is a ``function_call_output``; Messages: its last message holds a ``tool_result``
block) carries ``after_s``: the seconds from the end of the previous answered request of its session
and branch to its own start, the time the client's tools took, which a replay waits again
(harness/serving/runner.py), as the workbench's manifest export records it. A request that brings a
user's message carries none: the user's pause is not replayed.

The session of a line: the ``X-Arbor-Session`` header (``session/branch``, as the workbench and
replay send it), else a client's own session header (Codex's ``session_id`` / ``conversation_id``,
Claude Code's ``X-Claude-Code-Session-Id``), else ``prompt_cache_key`` (Codex sets it to the
conversation), else Anthropic's ``metadata.user_id``, else ``capture``; the branch is ``main``
unless ``X-Arbor-Session`` names one.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from harness.manifest import API_PATHS, ManifestLine, write_manifest
from harness.serving import sse
from harness.serving.endpoint import server_root
from harness.serving.streamed_request import Measurement, accumulator_for

API_OF_PATH = {path: api for api, path in API_PATHS.items()}
#: headers a client uses to name its session, in the order they are read
SESSION_HEADERS = ("session_id", "conversation_id", "x-claude-code-session-id")
#: hop-by-hop headers and those httpx sets itself: never passed through
_DROP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade", "te", "trailer",
         "proxy-authorization", "proxy-authenticate"}
DEFAULT_SESSION = "capture"
MAIN_BRANCH = "main"


def session_of(headers: dict[str, str], body: dict[str, Any]) -> tuple[str, str]:
    """(session_id, branch_id) of a captured request (see the module's docstring)."""
    arbor = headers.get("x-arbor-session")
    if arbor:
        session, _, branch = arbor.partition("/")
        return session, branch or MAIN_BRANCH
    for name in SESSION_HEADERS:
        if headers.get(name):
            return headers[name], MAIN_BRANCH
    if isinstance(body.get("prompt_cache_key"), str) and body["prompt_cache_key"]:
        return body["prompt_cache_key"], MAIN_BRANCH
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str) and metadata["user_id"]:
        return metadata["user_id"], MAIN_BRANCH
    return DEFAULT_SESSION, MAIN_BRANCH


def returns_tool_results(api: str, body: dict[str, Any]) -> bool:
    """Whether the request of ``api`` brings tool results back (its last message or input item is one)."""
    if api == "chat":
        messages = body.get("messages")
        return isinstance(messages, list) and bool(messages) and isinstance(messages[-1], dict) \
            and messages[-1].get("role") == "tool"
    if api == "responses":
        items = body.get("input")
        return isinstance(items, list) and bool(items) and isinstance(items[-1], dict) \
            and items[-1].get("type") == "function_call_output"
    messages = body.get("messages")
    if not (isinstance(messages, list) and messages and isinstance(messages[-1], dict)):
        return False
    content = messages[-1].get("content")
    return messages[-1].get("role") == "user" and isinstance(content, list) and any(
        isinstance(block, dict) and block.get("type") == "tool_result" for block in content)


def output_tokens(api: str, answer: dict[str, Any]) -> int | None:
    """The output tokens a whole (not streamed) answer of ``api`` reports."""
    usage = answer.get("usage") or {}
    value = usage.get("completion_tokens") if api == "chat" else usage.get("output_tokens")
    return int(value) if isinstance(value, int) else None


class _StreamReader:
    """Reads the SSE ``data:`` lines of a streamed answer as they pass, for its usage."""

    def __init__(self, api: str) -> None:
        self.m = Measurement(started=0.0)
        self._acc = accumulator_for(api, self.m)
        self._lines = sse.DataLines()

    def feed(self, chunk: bytes) -> None:
        for data in self._lines.feed(chunk):
            if data == sse.DONE:
                continue
            try:
                event = json.loads(data)
            except ValueError:
                continue
            if isinstance(event, dict):
                self._acc.feed(event, 0.0)

    def output_tokens(self) -> int | None:
        self._acc.finish()
        return self.m.completion_tokens


class Recorder:
    """The captured lines and the manifest file they are written to."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.started = time.perf_counter()
        self.lines: list[ManifestLine] = []
        self._ends: dict[tuple[str, str], list[float]] = {}  # (session, branch) -> its answers' ends
        self._lock = asyncio.Lock()

    def now(self) -> float:
        """Seconds since the proxy started (a line's ``t`` and its answer's end)."""
        return round(time.perf_counter() - self.started, 6)

    async def add(self, line: ManifestLine, ended: float, tool_results: bool = False) -> None:
        """Record ``line``, whose answer ended at ``ended``; ``tool_results``: it brings tool results back,
        so it waits (``after_s``) from the end of its branch's latest answer that ended before it began."""
        async with self._lock:
            key = (line.session_id, line.branch_id)
            before = [end for end in self._ends.get(key, ()) if end <= line.t]
            if tool_results and before:
                line = dataclasses.replace(line, after_s=round(line.t - max(before), 3))
            self._ends.setdefault(key, []).append(ended)
            self.lines.append(line)
            self.lines.sort(key=lambda ln: ln.t)  # arrival order; answers may end in another
            write_manifest(self.lines, self.out)


def build_app(upstream: str, out: Path, timeout_s: float = 600.0) -> FastAPI:
    """The proxy: every request to ``upstream``; the three APIs' answered POSTs recorded to ``out``."""
    root = server_root(upstream)
    recorder = Recorder(out)
    client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=30.0))

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await client.aclose()

    app = FastAPI(title="arbor replay record", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.recorder = recorder

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"])
    async def proxy(path: str, request: Request) -> Response:
        t = recorder.now()
        raw = await request.body()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP}
        api = API_OF_PATH.get("/" + path) if request.method == "POST" else None
        body: Any = None
        if api is not None:
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
            if not isinstance(body, dict):
                api = None  # not a request body a replay could send: passed through, not recorded
        url = f"{root}/{path}" + (f"?{request.url.query}" if request.url.query else "")
        upstream_request = client.build_request(request.method, url, headers=headers, content=raw)
        try:
            answer = await client.send(upstream_request, stream=True)
        except httpx.HTTPError as exc:
            return Response(json.dumps({"error": {"message": f"upstream: {type(exc).__name__}: {exc}",
                                                  "type": "upstream_error"}}),
                            status_code=502, media_type="application/json")
        passed = {k: v for k, v in answer.headers.items() if k.lower() not in _DROP}

        async def record(expected: int | None) -> None:
            assert api is not None and isinstance(body, dict)
            session, branch = session_of({k.lower(): v for k, v in request.headers.items()}, body)
            await recorder.add(ManifestLine(t=t, session_id=session, branch_id=branch, body=body,
                                            expected_output_tokens=expected, api=api), recorder.now(),
                               tool_results=returns_tool_results(api, body))

        streamed = answer.headers.get("content-type", "").startswith("text/event-stream")
        if not streamed:
            content = await answer.aread()
            await answer.aclose()
            if api is not None and answer.status_code == 200:
                try:
                    expected = output_tokens(api, json.loads(content))
                except (ValueError, AttributeError):
                    expected = None
                await record(expected)
            passed.pop("content-encoding", None)  # httpx decoded it
            return Response(content, status_code=answer.status_code, headers=passed)

        reader = _StreamReader(api) if api is not None else None

        async def relay() -> AsyncIterator[bytes]:
            complete = False
            try:
                async for chunk in answer.aiter_bytes():
                    if reader is not None:
                        reader.feed(chunk)
                    yield chunk
                complete = True
            finally:
                await answer.aclose()
                if complete and reader is not None and answer.status_code == 200:
                    await record(reader.output_tokens())

        passed.pop("content-encoding", None)
        return StreamingResponse(relay(), status_code=answer.status_code, headers=passed)

    return app


def serve(upstream: str, out: Path, host: str, port: int) -> None:
    import uvicorn

    out.parent.mkdir(parents=True, exist_ok=True)
    app = build_app(upstream, out)
    print(f"recording {', '.join(API_PATHS.values())} to {out}; clients use http://{host}:{port} "
          f"(OpenAI clients: http://{host}:{port}/v1); upstream {server_root(upstream)}", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
    print(f"{len(app.state.recorder.lines)} requests recorded in {out}")
