"""Token log-probabilities in the three shapes clients expect.

- chat (OpenAI): `{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}], "refusal": null}`
- text completions (OpenAI legacy): `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`
- llama-server's native /completion: `completion_probabilities`, a list of
  `{"id", "token", "bytes", "logprob", "top_logprobs": [{"id", "token", "bytes", "logprob"}]}`

Token text is the token's bytes decoded as UTF-8 (a piece of a multi-byte character shows
U+FFFD; `bytes` has the exact bytes). Special tokens are shown by name (e.g. `<|im_end|>`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from server.engine.logprobs import TokenLogprob

Piece = Callable[[int], bytes]  # token id -> its bytes


def _text(piece: Piece, token: int) -> tuple[str, list[int]]:
    raw = piece(token)
    return raw.decode("utf-8", errors="replace"), list(raw)


def _token(piece: Piece, token: int, logprob: float, with_id: bool) -> dict[str, Any]:
    text, raw = _text(piece, token)
    head: dict[str, Any] = {"id": token} if with_id else {}
    return {**head, "token": text, "logprob": logprob, "bytes": raw}


def _entries(entries: Iterable[TokenLogprob], piece: Piece, with_id: bool) -> list[dict[str, Any]]:
    return [{**_token(piece, e.token, e.logprob, with_id),
             "top_logprobs": [_token(piece, tok, lp, with_id) for tok, lp in e.top]} for e in entries]


def chat_logprobs(entries: Iterable[TokenLogprob], piece: Piece) -> dict[str, Any]:
    return {"content": _entries(entries, piece, with_id=False), "refusal": None}


def completion_logprobs(entries: Iterable[TokenLogprob], piece: Piece, text_offset: int = 0) -> dict[str, Any]:
    """The legacy shape; `text_offset` is where the first token's text starts in the choice's text."""
    tokens, lps, tops, offsets = [], [], [], []
    for e in entries:
        text, _ = _text(piece, e.token)
        tokens.append(text)
        lps.append(e.logprob)
        tops.append({_text(piece, tok)[0]: lp for tok, lp in e.top})
        offsets.append(text_offset)
        text_offset += len(text)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def native_probabilities(entries: Iterable[TokenLogprob], piece: Piece) -> list[dict[str, Any]]:
    return _entries(entries, piece, with_id=True)
