"""tests/server/near_tie.py: when two greedy answers count as the same computation."""

from __future__ import annotations

from tests.server.near_tie import NEAR_TIE_NATS, Step, first_parting, parting_problem


def _steps(*rows):
    return [Step(tok, lp, top) for tok, lp, top in rows]


A = ("a", -0.5, {"a": -0.5, "b": -0.6})
B_CLOSE = ("b", -0.55, {"b": -0.55, "a": -0.58})  # the other run put a 0.03 below b
B_FAR = ("b", -0.1, {"b": -0.1, "a": -0.1 - 2 * NEAR_TIE_NATS})
TAIL = ("c", -0.2, {"c": -0.2})


def test_equal_answers_and_near_ties_pass():
    assert parting_problem(_steps(A, TAIL), _steps(A, TAIL)) is None
    assert parting_problem(_steps(TAIL, A, TAIL), _steps(TAIL, B_CLOSE, ("d", -0.1, {"d": -0.1}))) is None


def test_a_choice_far_below_the_other_runs_fails():
    problem = parting_problem(_steps(TAIL, A), _steps(TAIL, B_FAR))
    assert problem is not None and "token 1" in problem
    missing = ("b", -0.1, {"b": -0.1})  # the other run's choice is not even among this one's top
    assert parting_problem(_steps(A), _steps(missing)) is not None


def test_an_answer_that_stops_early_is_reported():
    assert first_parting(["a", "c"], ["a"]) == 1
    assert "ends at token 1" in parting_problem(_steps(A, TAIL), _steps(A))
