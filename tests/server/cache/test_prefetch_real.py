"""Prefetch on the real engine (issue 58, item 3): a session in a tool wait whose KV went to host RAM is
brought back to a resident owner before its predicted return, so its next request attaches it (S)
instead of restoring it from host on admission (H); with `--cache-prefetch off` the same run restores
from H. The lifecycle model learns the tool waits' length from earlier sessions of the same run."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from server.cache.lifecycle import CacheHint
from tests.server.cache.engine_harness import chat_tokens, generate, kept_cells, reset_kv, used_cells
from tests.server.cache.test_router_real import load

pytestmark = pytest.mark.model

TOOL_WAIT_S = 0.6  # every tool of this run answers after this long
TEACHING = 5  # sessions whose returns teach the model the wait (it times returns after 4)


def _turns(model, n: int) -> list[tuple[list[int], list[int]]]:
    """(first prompt, second prompt) of `n` sessions: their own system prompts, the second prompt the
    first one's tokens followed by a tool result's."""
    out = []
    for i in range(n):
        first = chat_tokens(model, f"You are agent {i} of the plant. Check devices one at a time and report. " * 3,
                            f"Task {i}: find the failing pump.")
        out.append((first, first + model.runtime.tokenize(f" Tool result {i}: pump-{i} vibration high.",
                                                          add_special=False, parse_special=False)))
    return out


def _run(prefetch: str, disk: Path | None = None, beside_decode: bool = False) -> dict:
    """The run; `disk`: the KV goes to a disk tier there (no host tier), which the prefetch reads on its
    I/O thread; `beside_decode`: another request decodes through the last tool wait (the prefetch then goes
    beside its steps)."""
    tiers = {"cache_tiers": ("A", "S", "D"), "cache_dir": disk} if disk is not None else {}
    model = load(None, parallel=2, cache_policy="predictive", cache_predict_step=0.1, cache_prefetch=prefetch,
                 spec_type="none", **tiers)
    try:
        sessions = _turns(model, TEACHING + 1)
        for i, (first, second) in enumerate(sessions[:TEACHING]):
            generate(model, first, max_tokens=2, hint=CacheHint(session=f"s{i}", state="tool_wait"))
            time.sleep(TOOL_WAIT_S)
            generate(model, second, max_tokens=2, hint=CacheHint(session=f"s{i}", state="done"))
        first, second = sessions[TEACHING]
        generate(model, first, max_tokens=2, hint=CacheHint(session="x", state="tool_wait"))
        decoding = None
        if beside_decode:  # running before x's KV leaves the device, so no part of its prefetch finds the engine idle
            poem = chat_tokens(model, "You are a poet.", "Write a long poem about pumps.")
            decoding = threading.Thread(target=generate, args=(model, poem), kwargs={"max_tokens": 400,
                                                                                     "ignore_eos": True})
            decoding.start()
            deadline = time.monotonic() + 60
            while not model.engine.scheduler.running and time.monotonic() < deadline:
                time.sleep(0.01)
        reset_kv(model)  # device copies gone (written back to host), as under pressure from other sessions
        time.sleep(TOOL_WAIT_S)
        got = generate(model, second, max_tokens=2, hint=CacheHint(session="x", state="done"))
        if decoding is not None:
            decoding.join(300)
        stats = model.router.stats()
        reset_kv(model)
        leak = used_cells(model) - kept_cells(model)
        return {"source": got.final.cache.source, "cached": got.final.cached_tokens, "first": len(first),
                "prefetch": stats["prefetch"], "leak": leak, "owner_ids": model.seq_ids.in_use("owner")}
    finally:
        model.close()


def test_a_tool_wait_comes_back_to_kv_already_on_the_device():
    on = _run("on")
    assert on["prefetch"]["enabled"] and on["prefetch"]["jobs"] >= 1, on
    assert on["source"] == "S" and on["cached"] == on["first"], on
    assert on["prefetch"]["hit_tokens"] >= on["first"] - 64, on  # what was brought up was used
    assert on["prefetch"]["failed"] == 0 and on["prefetch"]["late"] == 0, "brought up before the call, not at it"
    assert on["leak"] == 0 and on["owner_ids"] == 0, "every owner and cell given back after a reset"
    off = _run("off")
    assert off["prefetch"] == {"enabled": False, "why": "--cache-prefetch off"}
    assert off["source"] == "H" and off["cached"] == off["first"], off


def test_a_prefetch_beside_a_decoding_request_is_staged_and_written_beside_it():
    """Another request decodes through the wait: the prefetch's host part is joined on a thread, its cells taken on
    the engine thread and written beside the decode steps (server/cache/prefetch.py), and the call attaches it."""
    on = _run("on", beside_decode=True)
    assert on["prefetch"]["staged"] >= 1 and on["prefetch"]["pieces"] == 0, on
    assert on["source"] == "S" and on["cached"] == on["first"], on
    assert on["prefetch"]["failed"] == 0 and on["prefetch"]["late"] == 0, on
    assert on["leak"] == 0 and on["owner_ids"] == 0, on


def test_a_tool_wait_comes_back_from_disk_read_ahead_of_its_call(tmp_path):
    on = _run("on", disk=tmp_path / "kv")
    assert on["source"] == "S" and on["cached"] == on["first"], on
    assert on["prefetch"]["late"] == 0 and on["prefetch"]["failed"] == 0, on
    off = _run("off", disk=tmp_path / "kv-off")
    assert off["source"] == "D" and off["cached"] == off["first"], off


def test_prefetch_needs_the_predictive_policy():
    model = load(None, parallel=2, cache_policy="lifecycle", spec_type="none")
    try:
        assert model.router.stats()["prefetch"] == {
            "enabled": False, "why": "the cache policy is not predictive (prefetch follows its predictions)"}
    finally:
        model.close()
