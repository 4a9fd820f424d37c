"""A streamed reply as Anthropic's server-sent events, as the `anthropic` client reads them.

`message_start` (the message with no content; its usage counts the whole prompt as input, since
what the cache reused is known only at the end) and a `ping` open the stream. Then one block
at a time, in the order the family's parser reads the reply (server.api.engine_bridge.reply_stream):
`content_block_start`, its deltas (`thinking_delta`, `text_delta`, or a `tool_use`'s
`input_json_delta` pieces), `content_block_stop`; a block of another kind closes the open one
first. `message_delta` carries the stop reason and the final usage (cumulative totals: the
client overwrites message_start's), and `message_stop` ends the stream. An engine error after
the start is an `error` event, as Anthropic sends one.
"""

from __future__ import annotations

from typing import Any

from server.api.engine_bridge.reply_stream import ContentDelta, Delta, ReasoningDelta, ReplyStream, ToolCallDelta
from server.api.http.errors import APIError
from server.api.protocols.anthropic_messages.cache_control import PromptCache
from server.api.protocols.anthropic_messages.errors import from_api_error
from server.api.protocols.anthropic_messages.reply import stop_reason, usage
from server.api.protocols.finish_report import arbor_extension
from server.api.streaming.sse import sse_event
from server.engine.sequence import Finished, TextDelta


class MessageEvents:
    """The stream driver's writer (server.api.streaming.driver) of one streamed message. `_open`
    is the open block: its kind and, for a tool_use, the index of its call in the reply."""

    def __init__(self, mid: str, model: str, reader: ReplyStream, prompt_tokens: int, cache: PromptCache,
                 stop_sequences: list[str]):
        self._mid, self._model = mid, model
        self._reader = reader
        self._prompt_tokens = prompt_tokens
        self._cache = cache
        self._stops = stop_sequences
        self._index = -1  # of the last block started
        self._open: tuple[str, int] | None = None

    def opening(self) -> str:
        start: dict[str, Any] = {
            "id": self._mid, "type": "message", "role": "assistant", "model": self._model, "content": [],
            "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": self._prompt_tokens, "output_tokens": 0, "cache_creation_input_tokens": 0,
                      "cache_read_input_tokens": 0},
        }
        return (sse_event("message_start", {"type": "message_start", "message": start})
                + sse_event("ping", {"type": "ping"}))

    def delta(self, index: int, event: TextDelta) -> str:
        return self._frames(self._reader.feed(event.text))

    def finish(self, index: int, fin: Finished) -> str:
        """What the strict reading of the whole reply adds, the open block's end, the stop reason
        and usage, the end of the message."""
        out = self._frames(self._reader.finish()) + self._close()
        stop = stop_reason(fin, self._reader.calls, self._stops)
        counts = usage(fin, self._cache)
        out += sse_event("message_delta", {"type": "message_delta",
                                           "delta": {"stop_reason": stop.reason, "stop_sequence": stop.sequence},
                                           "usage": counts, "arbor": arbor_extension(fin)})
        return out + sse_event("message_stop", {"type": "message_stop"})

    def error(self, error: APIError) -> str:
        return sse_event("error", from_api_error(error))

    def end(self, fins: list[Finished] | None) -> str:
        return ""  # message_stop (or the error event) ends the stream

    def close(self) -> None:
        self._reader.close()

    def _start(self, kind: str, block: dict[str, Any], call: int = -1) -> str:
        out = self._close()
        self._index += 1
        self._open = (kind, call)
        return out + sse_event("content_block_start", {"type": "content_block_start", "index": self._index,
                                                       "content_block": block})

    def _close(self) -> str:
        if self._open is None:
            return ""
        self._open = None
        return sse_event("content_block_stop", {"type": "content_block_stop", "index": self._index})

    def _delta(self, delta: dict[str, Any]) -> str:
        return sse_event("content_block_delta", {"type": "content_block_delta", "index": self._index, "delta": delta})

    def _frames(self, parts: list[Delta]) -> str:
        out: list[str] = []
        for p in parts:
            if isinstance(p, ReasoningDelta):
                if self._open is None or self._open[0] != "thinking":
                    out.append(self._start("thinking", {"type": "thinking", "thinking": "", "signature": ""}))
                out.append(self._delta({"type": "thinking_delta", "thinking": p.text}))
            elif isinstance(p, ContentDelta):
                if self._open is None or self._open[0] != "text":
                    out.append(self._start("text", {"type": "text", "text": ""}))
                out.append(self._delta({"type": "text_delta", "text": p.text}))
            elif isinstance(p, ToolCallDelta):
                if p.name is not None:
                    out.append(self._start("tool_use", {"type": "tool_use", "id": p.id, "name": p.name, "input": {}},
                                           call=p.index))
                if p.arguments and self._open == ("tool_use", p.index):
                    out.append(self._delta({"type": "input_json_delta", "partial_json": p.arguments}))
                # arguments of a call whose block is closed cannot be sent (blocks do not reopen);
                # the parser grows only the last call, so this does not happen with a well-formed reply
        return "".join(out)
