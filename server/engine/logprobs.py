"""Log-probabilities of sampled tokens, read from the logits llama.cpp already computed.

A `TokenLogprob` holds the model's log-probability of the token that was sampled and of
the `k` most likely tokens at that position, from a log-softmax over the raw logits of the
output row (the model's own distribution: before temperature, penalties, grammar or any
other sampling step, as OpenAI reports them). No extra decode is run, and nothing is
computed for requests that did not ask.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_TOP_LOGPROBS = 20  # OpenAI's limit for top_logprobs


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token, logprob), most likely first


def token_logprob(logits: np.ndarray, chosen: int, k: int) -> TokenLogprob:
    """The log-probability of `chosen` and of the `k` most likely tokens in one row of logits.

    Ties among the top tokens go to the lower token id, as an argmax (greedy) picks them,
    so at temperature 0 the first top token is the sampled one.
    """
    row = logits.astype(np.float64, copy=False)
    peak = float(row.max())
    log_total = peak + float(np.log(np.exp(row - peak).sum()))
    top: tuple[tuple[int, float], ...] = ()
    if k > 0:
        k = min(k, row.shape[0])
        idx = np.argpartition(-row, k - 1)[:k] if k < row.shape[0] else np.arange(row.shape[0])
        # the k-th value may be tied with values outside idx: take every token at that value
        cut = row[idx].min()
        idx = np.flatnonzero(row >= cut)
        order = np.lexsort((idx, -row[idx]))[:k]
        top = tuple((int(t), float(row[t]) - log_total) for t in idx[order])
    return TokenLogprob(int(chosen), float(row[chosen]) - log_total, top)
