"""The SSE frames of one streamed chat choice: reasoning and content deltas and tool calls as the
family's parser reads them out of the text (server.api.engine_bridge.reply_stream), log-probabilities
when asked for, and the choice's last chunk."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from server.api.engine_bridge.reply_stream import ContentDelta, Delta, ReasoningDelta, ReplyStream, ToolCallDelta
from server.api.protocols.finish_report import arbor_extension, timings
from server.api.protocols.logprob_format import chat_logprobs
from server.api.protocols.openai_body import ServedModel
from server.api.protocols.openai_chat.reply import chat_chunk, finish_reason
from server.api.streaming.sse import TEXT_SLOT, sse, sse_with_text
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
        finish_reason, llama-server `timings` and `arbor` extension."""
        head = self._frames(self._reader.finish(), None)
        reason = finish_reason(fin, self._reader.calls)
        extra = {"timings": timings(fin), "arbor": arbor_extension(fin)}
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
