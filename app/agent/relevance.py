"""Which items of a long list a trimmed tool result keeps: relevance to the turn's question.

When a tool result must be cut (app/agent/trimming.py), a list keeps at most N of its items.
They are ranked by

    score = bm25(query, item) / max over the list's items  +  FLAG_WEIGHT * flagged(item)

- ``bm25``: Okapi BM25 (the `rank-bm25` package, Lucene's idf) of the item's rendered text against the query:
  the words of the turn's question (its user message) and the values of the tool call's
  arguments. It is normalised by the list's best score, so it lies in [0, 1] whatever the list.
- ``flagged``: the item mentions a fault (anomaly, error, failure, ...: FLAGGED). This prior keeps
  the evidence an agent usually needs when the question shares no word with the data ("what is
  going on?"), and ranks a matching fault above a matching routine line.

An item that matches nothing and mentions no fault scores 0; ties go to the earlier item, so
with no query and no fault the list keeps its first items, as it did before ranking existed.

Contract: `select` is deterministic (same items and query, same choice, byte for byte: no
randomness, no dict-order or hash dependence, ties broken by position), returns the kept
indices in their original order, and never keeps more than `limit`. Words are lower-cased,
lightly stemmed (errors/error, failing/fail), English stop words dropped; runs of CJK characters
(the story writer's data is Chinese), which carry no spaces, become character bigrams.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rank_bm25 import BM25Okapi

# Items whose text mentions one of these are flagged: kept before unrelated ones when a list must
# be cut, so faults, errors and anomalies survive compression even when the question is unrelated.
FLAGGED = re.compile(r"anomal|error|fault|fail|critical|warn|alert|incident|degraded|down", re.IGNORECASE)
FLAG_WEIGHT = 0.5  # a flagged item with no match ties with an item at half the best match's score

_WORD = re.compile(r"[^\W_]+")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")
_STOP = frozenset("""
a about all an and any are as at be been but by can could did do does for from had has have how i if in
into is it its me my no not of on or our please show tell that the their them then there these this those
to us was we were what when where which who why will with would you your
""".split())


def tokens(text: str) -> list[str]:
    """The words of `text` as BM25 counts them (query and items alike)."""
    out: list[str] = []
    for word in _WORD.findall(text.lower()):
        if _CJK.search(word):
            out += _cjk_grams(word)
        elif word.isdigit() or (len(word) > 1 and word not in _STOP):
            out.append(_stem(word))
    return out


def _stem(word: str) -> str:
    # A light suffix strip, not a full stemmer: enough to meet "errors" with "error" and
    # "failing"/"failed" with "fail", without a language model of English.
    # ("es" is left alone: it would part "devices" from "device".)
    for suffix in ("ing", "ed", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3 and not word.endswith("ss"):
            return word[: -len(suffix)]
    return word


def _cjk_grams(word: str) -> list[str]:
    # Mixed runs ("pump泵") are split into their CJK and other parts first.
    grams: list[str] = []
    for part in re.findall(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+|[^\W_]+", word):
        if not _CJK.search(part):
            grams.append(_stem(part))
        elif len(part) == 1:
            grams.append(part)
        else:
            grams += [part[i:i + 2] for i in range(len(part) - 1)]
    return grams


@dataclass(frozen=True)
class RelevanceQuery:
    """What a trimmed result is ranked against: the turn's question and the call's arguments."""

    question: str = ""
    arguments: Any = None  # the tool call's arguments (their values count, not their names)

    @property
    def terms(self) -> tuple[str, ...]:
        """The query's distinct words, sorted (the order of a sum must not depend on the text's)."""
        return tuple(sorted(set(tokens(self.question)) | set(tokens(" ".join(_values(self.arguments))))))

    def describe(self, limit: int = 200) -> str:
        """The question as a trace shows it: whitespace collapsed, at most `limit` characters."""
        text = " ".join(self.question.split())
        return text if len(text) <= limit else text[: limit - 1] + "…"


def _values(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [v for item in value.values() for v in _values(item)]
    if isinstance(value, (list, tuple)):
        return [v for item in value for v in _values(item)]
    if value is None or isinstance(value, bool):
        return []
    return [str(value)]


@dataclass(frozen=True)
class Ranking:
    """Scores of one list's items: `relevance` (BM25 normalised to [0, 1]) and `flagged`."""

    relevance: tuple[float, ...]
    flagged: tuple[bool, ...]
    order: tuple[int, ...] = field(default=())  # indices, best first (ties: earlier first)

    def select(self, limit: int) -> list[int]:
        """The indices of the `limit` best items, in their original order."""
        return sorted(self.order[:max(limit, 0)])

    def reason(self, index: int) -> str:
        """Why item `index` ranks where it does: "relevant", "flagged" or "leading" (position)."""
        if self.relevance[index] > 0:
            return "relevant"
        return "flagged" if self.flagged[index] else "leading"


def rank(texts: Sequence[str], query: RelevanceQuery | None) -> Ranking:
    """Rank the items whose rendered texts are `texts` against `query` (None: the prior alone)."""
    flagged = tuple(bool(FLAGGED.search(text)) for text in texts)
    relevance = _bm25(texts, query.terms if query is not None else ())
    combined = [r + FLAG_WEIGHT * f for r, f in zip(relevance, flagged)]
    order = tuple(sorted(range(len(texts)), key=lambda i: (-combined[i], i)))
    return Ranking(relevance, flagged, order)


class _BM25(BM25Okapi):
    """Okapi BM25 with Lucene's idf, log(1 + (N - n + 0.5) / (n + 0.5)), which stays positive.

    rank-bm25's own idf, log((N - n + 0.5) / (n + 0.5)), is 0 for a word in half the items and
    negative past that (floored at a fraction of the average idf): in the short lists a result
    holds (tens of items) a question's device name found in half of them would count for nothing.
    """

    def _calc_idf(self, nd: dict) -> None:
        for word, freq in nd.items():
            self.idf[word] = math.log(1 + (self.corpus_size - freq + 0.5) / (freq + 0.5))


def _bm25(texts: Sequence[str], terms: tuple[str, ...]) -> tuple[float, ...]:
    documents = [tokens(text) for text in texts]
    # rank-bm25 divides by the corpus size, its average length and its vocabulary: an empty list,
    # one of empty items or an empty query has nothing to rank by.
    # A word every item has (a key of each record, the list's device name) tells none apart: it
    # would make every item "relevant" a little, so it is no query term here.
    common = set.intersection(*(set(d) for d in documents)) if len(documents) > 1 else set()
    terms = tuple(t for t in terms if t not in common)
    if not terms or not any(documents):
        return (0.0,) * len(texts)
    scores = _BM25(documents).get_scores(list(terms))
    raw = [max(float(s), 0.0) for s in scores]
    best = max(raw)
    return tuple(s / best if best > 0 else 0.0 for s in raw)
