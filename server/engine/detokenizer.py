"""Incremental detokenization: token pieces are bytes, and one UTF-8 character may be
split across tokens. The decoder holds incomplete bytes until the character is whole, so
streamed text never contains replacement characters that the full text would not."""

from __future__ import annotations

import codecs
from collections.abc import Callable


class IncrementalDetokenizer:
    def __init__(self, piece: Callable[[int], bytes]):
        self._piece = piece
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token: int) -> str:
        return self._decoder.decode(self._piece(token))

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)
