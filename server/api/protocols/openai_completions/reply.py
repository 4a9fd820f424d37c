"""A text completion's answer: the whole body and the chunk every streamed frame is (both
`text_completion`), with llama-server's `timings` and Arbor's `arbor` extension."""

from __future__ import annotations

import time
from typing import Any

from server.api.engine_bridge.generation import Collected
from server.api.protocols.logprob_format import Piece, completion_logprobs
from server.api.protocols.openai_body import ChoiceOut, ServedModel, head, totals


def whole_text_completion(rid: str, model: ServedModel, got: list[Collected], prefix: str,
                          piece: Piece | None) -> dict[str, Any]:
    """The answer of a non-streamed request: each choice's text after `prefix` (the prompt, when
    echoed), its log-probabilities when asked for (`piece` set)."""
    return text_completion(rid, model, [
        ChoiceOut(prefix + c.text, c.fin,
                  logprobs=completion_logprobs(c.logprobs, piece, len(prefix)) if piece is not None else None)
        for c in got])


def text_completion(rid: str, model: ServedModel, outs: list[ChoiceOut]) -> dict[str, Any]:
    choices = [{"index": i, "text": o.text, "logprobs": o.logprobs, "finish_reason": o.fin.finish_reason}
               for i, o in enumerate(outs)]
    return {**head(rid, "text_completion", int(time.time()), model), "choices": choices,
            **totals([o.fin for o in outs])}


def text_chunk(rid: str, model: ServedModel, created: int, text: str, finish: str | None = None,
               index: int = 0, logprobs: Any = None) -> dict[str, Any]:
    return {
        **head(rid, "text_completion", created, model),
        "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}],
    }
