"""The SSE frames of one streamed chat choice: content deltas, tool calls parsed out of the
text, log-probabilities when asked for, and the choice's last chunk."""

from __future__ import annotations

from collections.abc import Callable

from server.api import responses as R
from server.api.logprob_format import chat_logprobs
from server.api.tool_calls import ContentDelta, ParsedToolCall, ToolCallStreamParser
from server.engine.sequence import Finished, TextDelta


class ChatChoiceStream:
    """Frames for choice `index` of a chat stream. Content frames share one serialized
    template (R.sse_with_text); a delta that carries log-probabilities is serialized whole,
    its entries on its first content frame, or on an empty delta when the text is held back
    (a possible tool call)."""

    def __init__(self, rid: str, model: R.ServedModel, created: int, index: int, tool_names: frozenset[str],
                 piece: Callable[[int], bytes] | None):
        self._chunk = lambda delta, **kw: R.chat_chunk(rid, model, created, delta, index=index, **kw)
        self._content = R.sse_with_text(self._chunk({"content": R.TEXT_SLOT}))
        self._parser = ToolCallStreamParser(set(tool_names)) if tool_names else None
        self._piece = piece  # set when the client asked for logprobs
        self._n_calls = 0

    def opening(self) -> str:
        return R.sse(self._chunk({"role": "assistant", "content": ""}))

    def delta(self, ev: TextDelta) -> str:
        parts = self._parser.feed(ev.text) if self._parser else [ContentDelta(ev.text)]
        logprobs = chat_logprobs(ev.logprobs, self._piece) if self._piece is not None and ev.logprobs else None
        return self._frames(parts, logprobs)

    def finish(self, fin: Finished) -> str:
        """Held text and calls, then the choice's last chunk with its finish_reason, llama-server
        `timings` and `arbor` extension."""
        head = self._frames(self._parser.finish(), None) if self._parser else ""
        reason = R.finish_reason(fin, self._parser.calls if self._parser else [])
        extra = {"timings": R.timings(fin), "arbor": R.arbor_extension(fin)}
        return head + R.sse(self._chunk({}, finish=reason, extra=extra))

    def _frames(self, parts: list, logprobs: dict | None) -> str:
        out = []
        for p in parts:
            if isinstance(p, ContentDelta):
                if not p.text:
                    continue
                if logprobs is not None:
                    out.append(R.sse(self._chunk({"content": p.text}, logprobs=logprobs)))
                    logprobs = None
                else:
                    out.append(self._content(p.text))
            elif isinstance(p, ParsedToolCall):
                out.append(R.sse(self._chunk({"tool_calls": [p.as_openai(self._n_calls)]})))
                self._n_calls += 1
        if logprobs is not None:
            out.append(R.sse(self._chunk({}, logprobs=logprobs)))
        return "".join(out)
