"""SessionRun's figures (no servers): affinity, homes, computed tokens."""

from bench.cluster_sessions import SessionRun, Turn


def _t(session, k, replica, prompt=100, cached=0, status=200):
    return Turn(session, k, status, replica, prompt, cached)


def test_affinity_home_and_computed():
    run = SessionRun([_t("a", 1, "r2", cached=60), _t("a", 0, "r1"), _t("a", 2, "r1", cached=90),
                      _t("b", 0, "r2"), _t("b", 1, "r2", cached=100), _t("c", 0, None, status=502)])
    assert run.affinity() == {"a": 2 / 3, "b": 1.0, "c": 1.0}
    assert run.home() == {"a": "r1", "b": "r2", "c": None}
    assert [t.index for t in run.by_session()["a"]] == [0, 1, 2]
    assert run.computed() == 100 + 40 + 10 + 100 + 0  # the failed turn computed nothing
    assert run.statuses() == {200: 5, 502: 1}
