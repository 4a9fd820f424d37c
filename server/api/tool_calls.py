"""Turning model text into OpenAI tool calls, incrementally.

Recognised formats: Hermes/Qwen blocks `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
(any number, anywhere in the text), and a reply that is nothing but a JSON object (or list of
objects) with "name" and "arguments". Calls to functions that were not offered stay text.

`ToolCallStreamParser` is fed text deltas and yields content deltas and finished tool calls;
text that may still turn out to be a call is held back and never streamed as content.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from server.api.grammars import TOOL_CALL_CLOSE, TOOL_CALL_OPEN


@dataclass(frozen=True)
class ParsedToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI sends it

    def as_openai(self, index: int | None = None) -> dict:
        d = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        if index is not None:
            d["index"] = index
        return d


def _new_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _call_from_obj(obj: object, known: set[str]) -> ParsedToolCall | None:
    if not isinstance(obj, dict) or obj.get("name") not in known:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return ParsedToolCall(_new_id(), obj["name"], json.dumps(args, ensure_ascii=False))


def _calls_from_json_text(text: str, known: set[str]) -> list[ParsedToolCall] | None:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    items = value if isinstance(value, list) else [value]
    calls = [_call_from_obj(v, known) for v in items]
    if not calls or any(c is None for c in calls):
        return None
    return calls  # type: ignore[return-value]


@dataclass(frozen=True)
class ContentDelta:
    text: str


def _partial_suffix(buf: str, marker: str) -> int:
    for n in range(min(len(marker) - 1, len(buf)), 0, -1):
        if buf.endswith(marker[:n]):
            return n
    return 0


class ToolCallStreamParser:
    def __init__(self, known_functions: set[str]):
        self.known = known_functions
        self._buf = ""
        self._mode = "start"  # start | content | in_call | json
        self.calls: list[ParsedToolCall] = []
        self.truncated_call = False  # a call after the parsed ones was cut off and dropped

    def feed(self, delta: str) -> list[ContentDelta | ParsedToolCall]:
        self._buf += delta
        out: list[ContentDelta | ParsedToolCall] = []
        while True:
            if self._mode == "start":
                stripped = self._buf.lstrip()
                if not stripped:
                    return out
                if stripped[0] in "{[":
                    self._mode = "json"  # held whole until the end
                    return out
                self._mode = "content"
            if self._mode == "json":
                return out
            if self._mode == "content":
                i = self._buf.find(TOOL_CALL_OPEN)
                if i >= 0:
                    if self._buf[:i]:
                        out.append(ContentDelta(self._buf[:i]))
                    self._buf = self._buf[i + len(TOOL_CALL_OPEN):]
                    self._mode = "in_call"
                    continue
                keep = _partial_suffix(self._buf, TOOL_CALL_OPEN)
                emit = self._buf[: len(self._buf) - keep]
                if emit:
                    out.append(ContentDelta(emit))
                self._buf = self._buf[len(self._buf) - keep:]
                return out
            if self._mode == "in_call":
                j = self._buf.find(TOOL_CALL_CLOSE)
                if j < 0:
                    return out
                body, self._buf = self._buf[:j], self._buf[j + len(TOOL_CALL_CLOSE):]
                out.extend(self._close_call(body))
                self._mode = "content"

    def _close_call(self, body: str) -> list[ContentDelta | ParsedToolCall]:
        calls = _calls_from_json_text(body.strip(), self.known)
        if calls is None:
            return [ContentDelta(TOOL_CALL_OPEN + body + TOOL_CALL_CLOSE)]
        self.calls.extend(calls)
        return list(calls)

    def finish(self) -> list[ContentDelta | ParsedToolCall]:
        buf, self._buf = self._buf, ""
        if self._mode == "json":
            calls = _calls_from_json_text(buf.strip(), self.known)
            if calls is not None:
                self.calls.extend(calls)
                return list(calls)
            return [ContentDelta(buf)] if buf else []
        if self._mode == "in_call":
            calls = _calls_from_json_text(buf.strip(), self.known)  # closing tag cut off by EOS/length
            if calls is not None:
                self.calls.extend(calls)
                return list(calls)
            if self.calls:
                # a further call cut off by max_tokens: its half-written markup is no content
                self.truncated_call = True
                return []
            return [ContentDelta(TOOL_CALL_OPEN + buf)]
        return [ContentDelta(buf)] if buf else []
