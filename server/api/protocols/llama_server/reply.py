"""The answer of llama-server's native `POST /completion`: `content`, `stop`, `stop_type` (eos |
word | limit), `stopping_word`, `tokens_predicted`, `tokens_evaluated`, `tokens_cached`,
`timings`, `truncated`, `model`; streamed as `data: {...}` chunks of the same shape (no
`[DONE]`, as llama-server). `completion_probabilities` (when `n_probs` > 0) holds each generated
token's log-probability and the n_probs most likely tokens, as llama-server reports them with
`post_sampling_probs` off: from the model's distribution before sampling.
"""

from __future__ import annotations

from typing import Any

from server.api.engine_bridge.generation import Collected
from server.api.protocols.finish_report import arbor_extension, timings
from server.api.protocols.logprob_format import Piece, native_probabilities
from server.engine.sequence import Finished


def stop_type(fin: Finished) -> str:
    if fin.finish_reason == "length":
        return "limit"
    return "word" if fin.stop_word else "eos"


def completion_body(name: str, content: str, tokens: list[int] | None, prompt: str | None,
                    fin: Finished) -> dict[str, Any]:
    """The whole answer, or a stream's last chunk (`content` empty, `tokens` None)."""
    return {
        "index": 0,
        "content": content,
        "tokens": tokens or [],
        "id_slot": -1,
        "stop": True,
        "model": name,
        "prompt": prompt or "",
        "tokens_predicted": fin.completion_tokens,
        "tokens_evaluated": fin.prompt_tokens,
        "tokens_cached": fin.prompt_tokens + fin.completion_tokens,
        "has_new_line": "\n" in content,
        "truncated": False,
        "stop_type": stop_type(fin),
        "stopping_word": fin.stop_word or "",
        "timings": timings(fin),
        "arbor": arbor_extension(fin),
    }


def whole_completion(name: str, got: Collected, prompt: str | None, return_tokens: bool,
                     piece: Piece | None) -> dict[str, Any]:
    """The answer of a non-streamed request; `piece` set: with `completion_probabilities`."""
    final = completion_body(name, got.text, got.tokens if return_tokens else None, prompt, got.fin)
    if piece is not None:
        final["completion_probabilities"] = native_probabilities(got.logprobs, piece)
    return final
