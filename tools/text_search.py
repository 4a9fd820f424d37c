"""Keyword ranking for small local corpora (report notes, manual sections).

Scores a document by the query words it contains, each weighted by its rarity in the corpus
(inverse document frequency: "margin" outweighs a ticker every note of a company carries).
A word also matches a form sharing its first letters ("bearing" ~ "bearings", "overheat" ~
"overheating"), which is what a short model query needs without a stemmer. Ties keep
corpus order, so results are deterministic.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")

_WORD = re.compile(r"[a-z0-9]+")
_STOPWORDS = frozenset(
    "a an and are as at be by did do does for from has have how in is it its of on or the "
    "to was what when where which who why with about any me show tell give find".split()
)
_PREFIX_MIN = 4


def words(text: str) -> list[str]:
    """Lower-case words of `text` without stopwords."""
    return [w for w in _WORD.findall(text.lower()) if w not in _STOPWORDS]


def _matches(query_word: str, text_words: set[str]) -> bool:
    if query_word in text_words:
        return True
    if len(query_word) < _PREFIX_MIN:
        return False
    stem = query_word[:max(_PREFIX_MIN, len(query_word) - 3)]
    return any(w.startswith(stem) for w in text_words if len(w) >= _PREFIX_MIN)


def rank(query: str, items: Iterable[T], text_of: Callable[[T], str], limit: int) -> list[tuple[float, T]]:
    """Return up to `limit` (score, item) pairs with score > 0, best first."""
    query_words = list(dict.fromkeys(words(query)))
    if not query_words:
        return []
    texts = [(item, set(words(text_of(item)))) for item in items]
    matched = {w: [_matches(w, text_words) for _, text_words in texts] for w in query_words}
    weight = {w: math.log(1 + len(texts) / max(1, sum(hits))) for w, hits in matched.items()}
    scored = []
    for index, (item, _) in enumerate(texts):
        score = sum(weight[w] for w in query_words if matched[w][index])
        if score:
            scored.append((score, index, item))
    scored.sort(key=lambda entry: (-entry[0], entry[1]))
    return [(score, item) for score, _, item in scored[:limit]]
