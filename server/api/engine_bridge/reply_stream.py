"""Reading one reply as it streams: reasoning, content and tool calls, by the family's parser.

`ReplyStream` is fed the generated text piece by piece. Each time it asks llama.cpp's parser
(server.api.engine_bridge.chat_layer) to read everything so far as a partial reply, and hands out what grew
since the last look, as llama-server's `update_chat_msg` does: reasoning deltas, content deltas,
and tool-call deltas (a call's id and name once its name is complete, then its arguments as they
grow). Markup that may still become a tool call is never handed out as content: the parser
holds it back until it knows.

The end of the reply is parsed strictly; when that fails it is read as a partial reply, and when
even that fails it is plain content. A call whose arguments are not a whole JSON object at the
end (`max_tokens` cut it off) is dropped and `truncated_call` says so. A reply is never lost
and never turned into a server error.
"""

from __future__ import annotations

import json
import logging
import secrets
import string
from dataclasses import dataclass
from typing import Any

from server.api.engine_bridge.chat_layer import EMPTY_REPLY, ChatLayerError, ParsedReply, ReplyParser

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True)
class ContentDelta:
    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    """Part of tool call `index`: its id and name (first delta only), then argument text."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None

    def as_openai(self) -> dict:
        d: dict = {"index": self.index, "function": {"arguments": self.arguments}}
        if self.name is not None:
            d["id"], d["type"], d["function"]["name"] = self.id, "function", self.name
        return d


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI sends it

    def as_openai(self, index: int | None = None) -> dict:
        d: dict[str, Any] = {"id": self.id, "type": "function",
                             "function": {"name": self.name, "arguments": self.arguments}}
        if index is not None:
            d["index"] = index
        return d


Delta = ReasoningDelta | ContentDelta | ToolCallDelta


_ID_ALPHABET = string.ascii_letters + string.digits


def _new_id() -> str:
    """Nine letters and digits: every template the pinned llama.cpp ships accepts them back in the
    history (Mistral's refuse any other shape, e.g. OpenAI's call_...)."""
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(9))


def _grown(sent: str, now: str) -> str | None:
    """What `now` adds to the already streamed `sent`; None when it no longer extends it."""
    return now[len(sent):] if now.startswith(sent) else None


def _complete_calls_only(reply: ParsedReply, stream: ReplyStream) -> ParsedReply:
    """The reply without calls whose arguments are no JSON object (cut off by max_tokens or the
    end of generation: the parser reads leniently); `stream.truncated_call` says one was dropped."""
    kept = []
    for call in reply.tool_calls:
        try:
            complete = isinstance(json.loads(call.arguments or "{}"), dict)
        except json.JSONDecodeError:
            complete = False
        if complete:
            kept.append(call)
        else:
            stream.truncated_call = True
    if len(kept) == len(reply.tool_calls):
        return reply
    return ParsedReply(reply.content, reply.reasoning_content, tuple(kept))


class ReplyStream:
    def __init__(self, parser: ReplyParser | None):
        """`parser` None: the reply is plain text (nothing to parse, e.g. a raw grammar's output)."""
        self._parser = parser
        self._text = ""
        self._reasoning = ""  # streamed so far
        self._content = ""
        self._ids: list[str] = []
        self._names_sent: list[bool] = []
        self._args_sent: list[str] = []
        self.reply: ParsedReply = EMPTY_REPLY
        self.truncated_call = False  # a tool call the reply's end cut off was dropped
        self.parse_error: str | None = None

    @property
    def calls(self) -> list[ToolCall]:
        return [ToolCall(self._id(i), c.name, c.arguments) for i, c in enumerate(self.reply.tool_calls)]

    def feed(self, delta: str) -> list[Delta]:
        self._text += delta
        if self._parser is None:
            self.reply = ParsedReply(self._text, "", ())
            return self._diff(self.reply, final=False)
        try:
            reply = self._parser.parse(self._text, partial=True)
        except ChatLayerError:
            return []  # not readable yet: wait for more text
        return self._take(reply, final=False)

    def read(self, text: str) -> ParsedReply:
        """The whole reply at once (a non-streamed answer): parsed strictly, as `finish` does."""
        self._text = text
        if self._parser is None:
            self.reply = ParsedReply(text, "", ())
        else:
            self.finish()
        return self.reply

    def finish(self) -> list[Delta]:
        """The deltas the strict reading of the whole reply adds; closes the parser."""
        if self._parser is None:
            return []
        try:
            try:
                reply = self._parser.parse(self._text, partial=False)
            except ChatLayerError as strict:
                self.parse_error = str(strict)
                try:
                    reply = self._parser.parse(self._text, partial=True)
                except ChatLayerError:
                    log.warning("the reply could not be parsed (%s); it is returned as content", strict)
                    reply = ParsedReply(self._text, "", ())
            return self._take(_complete_calls_only(reply, self), final=True)
        finally:
            self._parser.close()

    def close(self) -> None:
        if self._parser is not None:
            self._parser.close()

    def _take(self, reply: ParsedReply, *, final: bool) -> list[Delta]:
        if not final and len(reply.tool_calls) < len(self.reply.tool_calls):
            # a later partial reading found fewer calls (should not happen): keep what was read
            reply = ParsedReply(reply.content, reply.reasoning_content, self.reply.tool_calls)
        self.reply = reply
        return self._diff(reply, final=final)

    def _id(self, index: int) -> str:
        while len(self._ids) <= index:
            given = self.reply.tool_calls[len(self._ids)].id if len(self._ids) < len(self.reply.tool_calls) else ""
            self._ids.append(given or _new_id())
        return self._ids[index]

    def _diff(self, reply: ParsedReply, *, final: bool) -> list[Delta]:
        out: list[Delta] = []
        grown = _grown(self._reasoning, reply.reasoning_content)
        if grown:
            out.append(ReasoningDelta(grown))
            self._reasoning = reply.reasoning_content
        grown = _grown(self._content, reply.content)
        if grown:
            out.append(ContentDelta(grown))
            self._content = reply.content
        for i, call in enumerate(reply.tool_calls):
            if i >= len(self._names_sent):
                self._names_sent.append(False)
                self._args_sent.append("")
            # a name is complete once its arguments began, a later call exists, or the reply ended
            name_done = bool(call.arguments) or i + 1 < len(reply.tool_calls) or final
            if not self._names_sent[i]:
                if not (name_done and call.name):
                    continue
                self._names_sent[i] = True
                out.append(ToolCallDelta(i, "", id=self._id(i), name=call.name))
            grown = _grown(self._args_sent[i], call.arguments)
            if grown:
                out.append(ToolCallDelta(i, grown))
                self._args_sent[i] = call.arguments
        return out
