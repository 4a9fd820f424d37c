"""The ideal number of computed prompt tokens for a workload (docs/replay.md, "Computed tokens and the ideal").

For each prompt in arrival order, the ideal cache computes its length minus the longest
prefix it shares with *any* earlier prompt, and never less than one token (a fully cached
prompt still recomputes its last token for logits). No cache can compute fewer tokens.

The longest shared prefix is found with a sorted list of the earlier prompts: among
sequences kept in lexicographic order, the one sharing the longest prefix with a query is
always one of the query's two neighbours at its insertion point. Inserting is a bisect plus
a list insert, so the whole workload costs O(n log n) comparisons and keeps no copy of the
tokens beyond one tuple per prompt.

Tokens may be any mutually comparable hashable values: token ids from a real tokenizer
(the server's, so the ideal is in the same unit as ``usage.prompt_tokens``), or the word
pieces of :func:`word_tokens` when no tokenizer is at hand (then the ideal is in words and
only its *fraction* of the total is comparable with a server's token counts).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field

#: A tokenizer turns text into a sequence of comparable tokens (ids or strings).
TextTokenizer = Callable[[str], Sequence[Hashable]]

_WORD_PIECE = re.compile(r"\s*\S+|\s+")


def word_tokens(text: str) -> list[str]:
    """Deterministic stand-in tokenization: each word with its leading whitespace.

    Concatenating the pieces gives ``text`` back, so two texts share a token prefix exactly
    when they share a word-aligned text prefix. One piece is roughly one BPE token for the
    common English words the generators use.
    """
    return _WORD_PIECE.findall(text)


@dataclass(frozen=True)
class IdealResult:
    """Ideal prefill for a workload, per prompt and in total (same unit as the tokens given)."""

    unit: str
    prompt_tokens: list[int] = field(default_factory=list)
    shared_prefix: list[int] = field(default_factory=list)
    computed: list[int] = field(default_factory=list)

    @property
    def total_prompt_tokens(self) -> int:
        return sum(self.prompt_tokens)

    @property
    def ideal_computed_tokens(self) -> int:
        return sum(self.computed)

    @property
    def ideal_fraction(self) -> float:
        """Ideal computed tokens over all prompt tokens (0 when the workload is empty)."""
        total = self.total_prompt_tokens
        return self.ideal_computed_tokens / total if total else 0.0

    def to_dict(self) -> dict:
        return {
            "unit": self.unit,
            "requests": len(self.computed),
            "total_prompt_tokens": self.total_prompt_tokens,
            "ideal_computed_tokens": self.ideal_computed_tokens,
            "ideal_fraction": self.ideal_fraction,
        }


def _common_prefix(a: Sequence[Hashable], b: Sequence[Hashable]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PrefixIndex:
    """Earlier prompts kept sorted, answering 'longest prefix shared with any of them'."""

    def __init__(self) -> None:
        self._sorted: list[tuple] = []

    def longest_shared_prefix(self, tokens: Sequence[Hashable]) -> int:
        key = tuple(tokens)
        at = bisect.bisect_left(self._sorted, key)
        best = 0
        if at > 0:
            best = _common_prefix(self._sorted[at - 1], key)
        if at < len(self._sorted):
            best = max(best, _common_prefix(self._sorted[at], key))
        return best

    def add(self, tokens: Sequence[Hashable]) -> None:
        bisect.insort(self._sorted, tuple(tokens))


def ideal_computed(prompts: Iterable[Sequence[Hashable]], unit: str = "tokens") -> IdealResult:
    """Ideal computed tokens for ``prompts`` given in arrival order (see module docstring)."""
    index = PrefixIndex()
    lengths: list[int] = []
    shared: list[int] = []
    computed: list[int] = []
    for tokens in prompts:
        prefix = index.longest_shared_prefix(tokens)
        lengths.append(len(tokens))
        shared.append(prefix)
        # An empty prompt computes nothing; any other prompt computes at least its last token.
        computed.append(max(1, len(tokens) - prefix) if tokens else 0)
        index.add(tokens)
    return IdealResult(unit=unit, prompt_tokens=lengths, shared_prefix=shared, computed=computed)
