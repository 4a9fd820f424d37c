"""A streamed text completion, as the stream driver (server.api.streaming.driver) writes it: the
echoed prompt first (`echo`), each choice's text as it comes (with its log-probabilities when
asked for, their `text_offset` counted from the choice's start), each choice's last chunk, then
the usage chunk (`stream_options.include_usage`) and `[DONE]`."""

from __future__ import annotations

import time

from server.api.http.errors import APIError
from server.api.protocols.finish_report import arbor_extension, timings
from server.api.protocols.logprob_format import Piece, completion_logprobs
from server.api.protocols.openai_body import ServedModel, usage_chunk
from server.api.protocols.openai_completions.reply import text_chunk
from server.api.streaming.sse import TEXT_SLOT, error_event, sse, sse_with_text
from server.engine.sequence import Finished, TextDelta


class CompletionStreamWriter:
    """Text chunks share one serialized template per choice (sse_with_text); a chunk with
    log-probabilities is serialized whole."""

    def __init__(self, rid: str, model: ServedModel, n: int, prefix: str, piece: Piece | None, include_usage: bool):
        self._rid, self._model, self._created = rid, model, int(time.time())
        self._frames = [sse_with_text(text_chunk(rid, model, self._created, TEXT_SLOT, index=i)) for i in range(n)]
        self._prefix = prefix  # the prompt, when echoed
        self._offsets = [len(prefix)] * n  # where each choice's next text starts (logprobs' text_offset)
        self._piece = piece  # set when the client asked for logprobs
        self._include_usage = include_usage

    def opening(self) -> str:
        return "".join(frame(self._prefix) for frame in self._frames) if self._prefix else ""

    def delta(self, index: int, event: TextDelta) -> str:
        if self._piece is None:
            out = self._frames[index](event.text)
        else:
            lp = completion_logprobs(event.logprobs, self._piece, self._offsets[index])
            out = sse(text_chunk(self._rid, self._model, self._created, event.text, index=index, logprobs=lp))
        self._offsets[index] += len(event.text)
        return out

    def finish(self, index: int, fin: Finished) -> str:
        last = text_chunk(self._rid, self._model, self._created, "", fin.finish_reason, index=index)
        last.update({"timings": timings(fin), "arbor": arbor_extension(fin)})
        return sse(last)

    def error(self, error: APIError) -> str:
        return error_event(error)

    def end(self, fins: list[Finished] | None) -> str:
        if fins is not None and self._include_usage:
            return sse(usage_chunk(self._rid, self._model, self._created, fins, "text_completion")) + sse("[DONE]")
        return sse("[DONE]")

    def close(self) -> None:
        pass
