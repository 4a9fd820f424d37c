"""A streamed answer of llama-server's native `POST /completion`, as the stream driver
(server.api.streaming.driver) writes it: a `data:` chunk per piece of text (its tokens when
`return_tokens`, its `completion_probabilities` when `n_probs`), then the whole answer's fields
as the last chunk; no `[DONE]`, as llama-server."""

from __future__ import annotations

from typing import Any

from server.api.http.errors import APIError
from server.api.protocols.llama_server.reply import completion_body
from server.api.protocols.logprob_format import Piece, native_probabilities
from server.api.streaming.sse import error_event, sse
from server.engine.sequence import Finished, TextDelta


class NativeCompletionStreamWriter:
    def __init__(self, name: str, n_prompt: int, prompt: str | None, return_tokens: bool, piece: Piece | None):
        self._name, self._n_prompt, self._prompt = name, n_prompt, prompt
        self._return_tokens = return_tokens
        self._piece = piece  # set when the client asked for n_probs
        self._n_predicted = 0

    def opening(self) -> str:
        return ""

    def delta(self, index: int, event: TextDelta) -> str:
        self._n_predicted += len(event.tokens)
        chunk: dict[str, Any] = {
            "index": 0, "content": event.text, "tokens": list(event.tokens) if self._return_tokens else [],
            "stop": False, "id_slot": -1, "tokens_predicted": self._n_predicted, "tokens_evaluated": self._n_prompt}
        if self._piece is not None:
            chunk["completion_probabilities"] = native_probabilities(event.logprobs, self._piece)
        return sse(chunk)

    def finish(self, index: int, fin: Finished) -> str:
        return sse(completion_body(self._name, "", None, self._prompt, fin))

    def error(self, error: APIError) -> str:
        return error_event(error)

    def end(self, fins: list[Finished] | None) -> str:
        return ""

    def close(self) -> None:
        pass
