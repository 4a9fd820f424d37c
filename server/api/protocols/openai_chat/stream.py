"""A streamed chat completion, as the stream driver (server.api.streaming.driver) writes it: per
choice, reasoning and content deltas and tool calls as the family's parser reads them out of the
text (server.api.engine_bridge.reply_stream), log-probabilities when asked for, and the choice's
last chunk; after every choice, the usage chunk (`stream_options.include_usage`) and `[DONE]`."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from server.api.engine_bridge.reply_stream import ContentDelta, Delta, ReasoningDelta, ReplyStream, ToolCallDelta
from server.api.http.errors import APIError
from server.api.protocols.finish_report import arbor_extension, timings
from server.api.protocols.logprob_format import chat_logprobs
from server.api.protocols.openai_body import ServedModel, usage_chunk
from server.api.protocols.openai_chat.reply import chat_chunk, finish_reason
from server.api.streaming.sse import TEXT_SLOT, error_event, sse, sse_with_text
from server.engine.sequence import Finished, TextDelta


class ChatChoiceStream:
    """Frames for choice `index` of a chat stream. Content frames share one serialized
    template (sse_with_text); a delta that carries log-probabilities is serialized whole,
    its entries on its first frame, or on an empty delta when the text is held back (the
    parser does not know yet what it is)."""

    def __init__(self, rid: str, model: ServedModel, created: int, index: int, reader: ReplyStream,
                 piece: Callable[[int], bytes] | None):
        self._chunk = lambda delta, **kw: chat_chunk(rid, model, created, delta, index=index, **kw)
        self._content = sse_with_text(self._chunk({"content": TEXT_SLOT}))
        self._reader = reader
        self._piece = piece  # set when the client asked for logprobs

    def opening(self) -> str:
        return sse(self._chunk({"role": "assistant", "content": ""}))

    def delta(self, ev: TextDelta) -> str:
        logprobs = chat_logprobs(ev.logprobs, self._piece) if self._piece is not None and ev.logprobs else None
        return self._frames(self._reader.feed(ev.text), logprobs)

    def finish(self, fin: Finished) -> str:
        """What the strict reading of the whole reply adds, then the choice's last chunk with its
        finish_reason, llama-server `timings` and `arbor` extension.

        A tool call the reply's end cut off (its arguments no whole JSON object) has had its
        name and the arguments so far streamed already, and cannot be taken back: the last
        chunk says so, with finish_reason "length" when `max_tokens` cut it (as OpenAI answers
        such a call) and ``arbor.truncated_tool_call`` true whatever ended it, so a client knows
        not to run it nor send it back (this server refuses arguments that are no JSON object).
        A whole (non-streamed) answer leaves such a call out."""
        head = self._frames(self._reader.finish(), None)
        reason = finish_reason(fin, self._reader.calls)
        extra = {"timings": timings(fin), "arbor": arbor_extension(fin)}
        if self._reader.truncated_call:
            extra["arbor"]["truncated_tool_call"] = True
        return head + sse(self._chunk({}, finish=reason, extra=extra))

    def close(self) -> None:
        self._reader.close()

    def _frames(self, parts: list[Delta], logprobs: dict | None) -> str:
        out = []
        for p in parts:
            delta: dict[str, Any]
            if isinstance(p, ContentDelta) and logprobs is None:
                out.append(self._content(p.text))
                continue
            if isinstance(p, ContentDelta):
                delta = {"content": p.text}
            elif isinstance(p, ReasoningDelta):
                delta = {"reasoning_content": p.text}
            elif isinstance(p, ToolCallDelta):
                delta = {"tool_calls": [p.as_openai()]}
            else:
                continue
            out.append(sse(self._chunk(delta, logprobs=logprobs) if logprobs is not None else self._chunk(delta)))
            logprobs = None
        if logprobs is not None:
            out.append(sse(self._chunk({}, logprobs=logprobs)))
        return "".join(out)


class ChatStreamWriter:
    """The stream driver's writer of a chat completion's `n` choices (one reply reader each)."""

    def __init__(self, rid: str, model: ServedModel, n: int, reader: Callable[[], ReplyStream],
                 piece: Callable[[int], bytes] | None, include_usage: bool):
        self._rid, self._model, self._created = rid, model, int(time.time())
        self._choices = [ChatChoiceStream(rid, model, self._created, i, reader(), piece) for i in range(n)]
        self._include_usage = include_usage

    def opening(self) -> str:
        return "".join(c.opening() for c in self._choices)

    def delta(self, index: int, event: TextDelta) -> str:
        return self._choices[index].delta(event)

    def finish(self, index: int, fin: Finished) -> str:
        return self._choices[index].finish(fin)

    def error(self, error: APIError) -> str:
        return error_event(error)

    def end(self, fins: list[Finished] | None) -> str:
        if fins is None or not self._include_usage:
            return sse("[DONE]")
        return sse(usage_chunk(self._rid, self._model, self._created, fins, "chat.completion.chunk")) + sse("[DONE]")

    def close(self) -> None:
        for choice in self._choices:
            choice.close()
