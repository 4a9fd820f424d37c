"""SessionRun's figures (no servers): affinity, homes, computed tokens."""

import pytest

from bench.cluster_sessions import SessionRun, Turn, endpoint


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


def test_computed_from_the_servers_timings():
    # llama-server's own count (timings.prompt_n) where it gives one; usage's otherwise
    run = SessionRun([Turn("a", 0, 200, "r1", 100, 0, prompt_n=100), Turn("a", 1, 200, "r1", 150, 90, prompt_n=70),
                      Turn("b", 0, 200, "r2", 100, 20), Turn("b", 1, 502, None, 0, 0, prompt_n=5)])
    assert run.computed() == 100 + 60 + 80
    assert run.computed("timings") == 100 + 70 + 80
    with pytest.raises(ValueError):
        run.computed("other")


def test_endpoint_by_body():
    assert endpoint({"messages": []}) == "/v1/chat/completions"
    assert endpoint({"prompt": "x"}) == "/v1/completions"
