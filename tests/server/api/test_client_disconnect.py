"""A request whose client has gone stops at once: queued, prefilling or decoding, streamed
or not (the real server on the embedded model)."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

pytestmark = pytest.mark.model

LONG = {"messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 2000, "ignore_eos": True}


def _metric(base_url: str, name: str) -> float:
    for line in httpx.get(base_url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def _processing(base_url: str) -> int:
    return sum(s["is_processing"] for s in httpx.get(base_url + "/slots", timeout=30).json())


def _wait(predicate, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _give_up_after(url: str, body: dict, seconds: float) -> None:
    """POST and abandon the request (close the connection) after `seconds` without an answer."""
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url, json=body, timeout=httpx.Timeout(60, read=seconds))


def test_a_non_streamed_request_stops_decoding_when_its_client_leaves(arbor_server):
    b = arbor_server.base_url
    abandoned = _metric(b, "arbor:requests_abandoned_total")
    _give_up_after(arbor_server.v1 + "/chat/completions", LONG, 4.0)
    decodes_when_left = _metric(b, "llamacpp:n_decode_total")
    assert _wait(lambda: _processing(b) == 0), "the slot kept working after its client left"
    # The engine ends the request at its next step: at most the step under way when the
    # client left (and one more if /metrics was answered before the disconnect was read).
    assert _metric(b, "llamacpp:n_decode_total") - decodes_when_left <= 3
    assert _metric(b, "arbor:requests_abandoned_total") == abandoned + 1
    slots = httpx.get(b + "/slots", timeout=30).json()
    assert max(s["n_past"] for s in slots) < 1000, slots  # it did not decode on towards 2,000


def test_a_queued_request_leaves_the_queue_when_its_client_leaves(arbor_server):
    b = arbor_server.base_url
    abandoned = _metric(b, "arbor:requests_abandoned_total")
    url = arbor_server.v1 + "/chat/completions"
    # Both slots busy with requests whose clients wait a while, then leave too.
    busy = [threading.Thread(target=_give_up_after, args=(url, LONG, 8.0)) for _ in range(2)]
    for t in busy:
        t.start()
    try:
        assert _wait(lambda: _processing(b) == 2)
        _give_up_after(url, {**LONG, "max_tokens": 8}, 1.0)  # waits in the queue, then leaves
        assert _wait(lambda: _metric(b, "llamacpp:requests_deferred") == 0, timeout=5)
        assert _processing(b) == 2  # it left the queue while the others still ran
    finally:
        for t in busy:
            t.join(timeout=60)
    assert _wait(lambda: _processing(b) == 0)
    assert _metric(b, "arbor:requests_abandoned_total") == abandoned + 3


def test_n_choices_all_stop_when_the_client_leaves(arbor_server):
    b = arbor_server.base_url
    abandoned = _metric(b, "arbor:requests_abandoned_total")
    _give_up_after(arbor_server.v1 + "/completions",
                   {"prompt": "Once upon a time", "n": 2, "max_tokens": 2000, "ignore_eos": True}, 3.0)
    assert _wait(lambda: _processing(b) == 0)
    assert _metric(b, "arbor:requests_abandoned_total") == abandoned + 2
