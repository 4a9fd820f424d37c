"""token_logprob: a log-softmax over one row of logits, the chosen token and the top k."""

from __future__ import annotations

import math

import numpy as np

from server.engine.logprobs import token_logprob


def reference(row: list[float]) -> list[float]:
    total = math.log(sum(math.exp(x) for x in row))
    return [x - total for x in row]


def test_matches_a_plain_log_softmax_and_orders_the_top_tokens():
    row = np.array([0.5, 3.0, -1.0, 2.0, 2.5], dtype=np.float32)
    got = token_logprob(row, chosen=3, k=3)
    ref = reference(row.tolist())
    assert got.token == 3 and math.isclose(got.logprob, ref[3], rel_tol=1e-6)
    assert [t for t, _ in got.top] == [1, 4, 3]
    assert all(math.isclose(lp, ref[t], rel_tol=1e-6) for t, lp in got.top)


def test_ties_go_to_the_lower_id_like_argmax():
    row = np.array([1.0, 4.0, 4.0, 4.0, 0.0], dtype=np.float32)
    got = token_logprob(row, chosen=int(row.argmax()), k=2)
    assert [t for t, _ in got.top] == [1, 2]
    assert got.top[0][0] == got.token


def test_k_zero_and_k_beyond_the_vocabulary():
    row = np.array([0.0, 1.0], dtype=np.float32)
    assert token_logprob(row, 0, 0).top == ()
    top = token_logprob(row, 0, 10).top
    assert [t for t, _ in top] == [1, 0]
    assert math.isclose(sum(math.exp(lp) for _, lp in top), 1.0, rel_tol=1e-6)


def test_large_logits_do_not_overflow():
    row = np.array([1000.0, 999.0, -1000.0], dtype=np.float32)
    got = token_logprob(row, 0, 1)
    assert math.isfinite(got.logprob) and got.logprob < 0
    assert math.isclose(got.logprob, -math.log1p(math.exp(-1.0)), rel_tol=1e-6)
