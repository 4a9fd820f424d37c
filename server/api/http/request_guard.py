"""The request guard: who may send a body, of what type, size and shape, checked before any route runs.

A pure ASGI middleware (so streaming and disconnect detection pass through untouched). For a
request other than GET/HEAD/OPTIONS, in this order:

- with --api-key, the key (401), before a byte of the body is read: a client without it costs
  the server no parsing;
- the content type: a body must come as ``Content-Type: application/json`` (parameters such as
  ``charset=utf-8`` and ``application/*+json`` types pass), anything else is a 415. JSON is not a
  CORS-safelisted type, so a browser page of another origin cannot send such a request without a
  preflight, which CORS refuses it (server.api.http.cors): no route that changes state can be driven
  from a form or a ``no-cors`` fetch. A request without a body (``POST /cache/flush``) needs the
  JSON type only when it comes from a browser (an ``Origin`` header, which browsers send on every
  POST): routers post their cache flush bare (SMG's ``POST /flush_cache``), and keep working;
- a body larger than ``--max-body-kib`` is a 413, from Content-Length when given, else while
  reading (it never buffers more than the limit);
- it parses the JSON once and refuses, with 400, nesting deeper than ``--max-json-depth`` (Python's
  decoder would otherwise hit its recursion limit), a string holding a lone UTF-16 surrogate
  (``"\\ud800"`` decodes to a Python str that cannot be encoded as UTF-8, so it would fail deep
  in tokenization or while writing the reply), and each request limit (`check_body`): messages,
  tools and their size, stop strings and their length, grammar length, JSON-schema size,
  logit_bias entries (a Responses request's ``text.format.schema`` is a schema too; its
  ``input`` items count as messages where it is translated, server.api.protocols.openai_responses);
- then hands the app the same bytes, so FastAPI's own parsing and validation run as before.

A body that is not JSON passes through: the routes answer it with their own 400. Errors use the
OpenAI format (server.api.http.errors) and name the flag that sets the limit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from server.api.http.deps import api_key_error
from server.api.http.errors import APIError
from server.settings import ServerSettings


@dataclass(frozen=True)
class Limits:
    body_bytes: int
    json_depth: int
    messages: int
    tools: int
    stop: int
    stop_chars: int
    tools_bytes: int = 256 * 1024
    grammar_chars: int = 65536
    schema_bytes: int = 64 * 1024
    logit_bias: int = 1024

    @classmethod
    def from_settings(cls, s: ServerSettings) -> Limits:
        return cls(s.max_body_kib * 1024, s.max_json_depth, s.max_messages, s.max_tools, s.max_stop,
                   s.max_stop_chars, s.max_tools_kib * 1024, s.max_grammar_chars, s.max_schema_kib * 1024,
                   s.max_logit_bias)


class _TooLarge(Exception):
    pass


class RequestGuard:
    def __init__(self, app, settings: ServerSettings):
        self.app = app
        self.limits = Limits.from_settings(settings)
        self.api_key = settings.api_key

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        try:
            err = api_key_error(_latin1(headers.get(b"authorization")), self.api_key,
                                x_api_key=_latin1(headers.get(b"x-api-key")))
            if err is not None:
                raise err
            json_type = check_content_type(_latin1(headers.get(b"content-type")))
            body = await self._read_body(scope, receive)
            if not json_type and (body or b"origin" in headers):
                raise _unsupported_type(_latin1(headers.get(b"content-type")), bool(body))
            check_body(body, self.limits)
        except APIError as err:
            return await err.response()(scope, receive, send)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # later messages: http.disconnect, which streaming watches for

        await self.app(scope, replay, send)

    async def _read_body(self, scope, receive) -> bytes:
        limit = self.limits.body_bytes
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise _too_large(int(declared), limit)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _too_large(size, limit, at_least=True)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)


def _latin1(value: bytes | None) -> str | None:
    return value.decode("latin-1") if value is not None else None


def check_content_type(value: str | None) -> bool:
    """True for a JSON media type (``application/json`` or ``application/*+json``, any parameters,
    any case), False when there is no Content-Type; 415 (APIError) for any other type."""
    if value is None or not value.strip():
        return False
    media = value.split(";", 1)[0].strip().lower()
    kind, _, subtype = media.partition("/")
    if kind == "application" and (subtype == "json" or subtype.endswith("+json")):
        return True
    raise _unsupported_type(value, True)


def _unsupported_type(value: str | None, has_body: bool) -> APIError:
    if value:
        got = f"Content-Type {value[:100]!r}"
    elif has_body:
        got = "a body without a Content-Type"
    else:
        got = "a browser request (Origin header) without a body or Content-Type"
    return APIError(f"{got}: this server takes JSON bodies only; send Content-Type: application/json",
                    status=415, param="Content-Type", code="unsupported_media_type")


def _too_large(size: int, limit: int, at_least: bool = False) -> APIError:
    more = "more than " if at_least else ""
    return APIError(f"request body of {more}{size} bytes is larger than this server accepts ({limit} bytes; "
                    "--max-body-kib)", status=413, code="request_too_large")


def check_body(body: bytes, limits: Limits) -> None:
    """400 (APIError) when a JSON body breaks a limit; a body that is not JSON is left to the route."""
    if not body:
        return
    try:
        data = json.loads(body)
    except RecursionError:  # nested past Python's own limit (about 1000 levels)
        raise _too_deep(limits) from None
    except ValueError:  # not JSON: the route says so
        return
    _check_values(data, limits)
    if not isinstance(data, dict):
        return
    for key, limit, flag in (("messages", limits.messages, "--max-messages"), ("tools", limits.tools, "--max-tools"),
                             ("stop", limits.stop, "--max-stop")):
        value = data.get(key)
        if isinstance(value, list) and len(value) > limit:
            raise APIError(f"{key}: {len(value)} given; this server accepts at most {limit} ({flag})", param=key,
                           code=f"too_many_{key}")
    stops = data.get("stop")
    for stop in [stops] if isinstance(stops, str) else stops if isinstance(stops, list) else ():
        if isinstance(stop, str) and len(stop) > limits.stop_chars:
            raise APIError(f"stop: a stop string of {len(stop)} characters; this server accepts at most "
                           f"{limits.stop_chars} (--max-stop-chars)", param="stop", code="stop_too_long")
    _check_sizes(data, limits)


def _check_sizes(data: dict, limits: Limits) -> None:
    """What a request asks the server to compile or apply at every token: tool definitions (the
    template renders them and llama.cpp's chat layer makes a grammar of their schemas), a
    grammar, a JSON schema (converted to a grammar on the event loop), logit_bias entries."""
    tools = data.get("tools")
    if isinstance(tools, list) and tools:
        size = _json_bytes(tools)
        if size > limits.tools_bytes:
            raise APIError(f"tools: {size} bytes of tool definitions; this server accepts at most "
                           f"{limits.tools_bytes} ({limits.tools_bytes // 1024} KiB, --max-tools-kib)", param="tools",
                           code="tools_too_large")
    grammar = data.get("grammar")
    if isinstance(grammar, str) and len(grammar) > limits.grammar_chars:
        raise APIError(f"grammar: {len(grammar)} characters; this server accepts at most {limits.grammar_chars} "
                       "(--max-grammar-chars)", param="grammar", code="grammar_too_large")
    fmt = data.get("response_format")
    schemas = [("json_schema", data.get("json_schema"))]
    if isinstance(fmt, dict) and isinstance(fmt.get("json_schema"), dict):
        schemas.append(("response_format.json_schema", fmt["json_schema"].get("schema")))
    text = data.get("text")  # the Responses API's text.format
    if isinstance(text, dict) and isinstance(text.get("format"), dict):
        schemas.append(("text.format.schema", text["format"].get("schema")))
    for param, schema in schemas:
        if schema is None:
            continue
        size = _json_bytes(schema)
        if size > limits.schema_bytes:
            raise APIError(f"{param}: a JSON schema of {size} bytes; this server accepts at most "
                           f"{limits.schema_bytes} ({limits.schema_bytes // 1024} KiB, --max-schema-kib)",
                           param=param, code="schema_too_large")
    bias = data.get("logit_bias")
    if isinstance(bias, (dict, list)) and len(bias) > limits.logit_bias:
        raise APIError(f"logit_bias: {len(bias)} entries; this server accepts at most {limits.logit_bias} "
                       "(--max-logit-bias)", param="logit_bias", code="too_many_logit_bias")


def _json_bytes(value: Any) -> int:
    """Size of `value` as compact UTF-8 JSON (its text was checked for lone surrogates already)."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))


def _check_values(data: Any, limits: Limits) -> None:
    """Depth and lone surrogates, walked without recursion."""
    stack: list[tuple[Any, int, str]] = [(data, 1, "")]
    while stack:
        value, depth, path = stack.pop()
        if isinstance(value, str):
            _check_text(value, path)
            continue
        if not isinstance(value, (dict, list)):
            continue
        if depth > limits.json_depth:
            raise _too_deep(limits)
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            where = f"{path}.{key}" if path else str(key)
            if isinstance(key, str):
                _check_text(key, where)
            stack.append((item, depth + 1, where))


def _check_text(text: str, path: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise APIError(f"{path or 'body'}: contains a lone UTF-16 surrogate (\\u{ord(text[exc.start]):04x}) at "
                       f"character {exc.start}, which is not valid Unicode text", param=path or None,
                       code="invalid_unicode") from None


def _too_deep(limits: Limits) -> APIError:
    return APIError(f"request body is nested deeper than {limits.json_depth} levels (--max-json-depth)",
                    code="too_deeply_nested")

