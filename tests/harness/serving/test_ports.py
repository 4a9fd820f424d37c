"""harness/serving/ports.py: the ports the tests' servers listen on never come from one pool shared by
every xdist worker (CI once saw one workbench's requests answered by another test's)."""

from __future__ import annotations

import socket

import pytest

from harness.serving import ports


@pytest.fixture
def fresh(monkeypatch):
    """free_port as a new process would see it: no cursor yet."""
    monkeypatch.setattr(ports, "_cursor", None)
    return monkeypatch


def _range(monkeypatch, worker: str | None) -> tuple[int, int]:
    if worker is None:
        monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    else:
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    start = ports.FIRST + ports._block() * ports.BLOCK
    return start, start + ports.BLOCK


def test_each_worker_draws_from_its_own_block_below_the_ephemeral_range(fresh):
    blocks = [_range(fresh, f"gw{i}") for i in range(8)] + [_range(fresh, None)]
    for i, (lo, hi) in enumerate(blocks):
        assert 1024 < lo < hi <= 32768
        for lo2, hi2 in blocks[i + 1:]:
            assert hi <= lo2 or hi2 <= lo, (blocks[i], (lo2, hi2))
    lo, hi = _range(fresh, "gw3")
    drawn = [ports.free_port() for _ in range(20)]
    assert all(lo <= p < hi for p in drawn) and len(set(drawn)) == 20


def test_a_port_something_listens_on_is_skipped(fresh):
    lo, hi = _range(fresh, "gw5")
    first = ports.free_port()
    fresh.setattr(ports, "_cursor", None)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", first))
        taken.listen()
        assert ports.free_port() == lo + (first - lo + 1) % (hi - lo)  # the next one in the block


def test_processes_of_one_worker_start_at_different_places(fresh):
    _range(fresh, "gw1")
    starts = set()
    for pid in (4101, 4102, 5003):
        fresh.setattr(ports.os, "getpid", lambda pid=pid: pid)
        fresh.setattr(ports, "_cursor", None)
        starts.add(ports.free_port())
    assert len(starts) == 3


def test_a_port_browsers_refuse_is_never_handed_out(fresh):
    """Worker gw0's block holds 10080, which Chromium refuses (ERR_UNSAFE_PORT): the walk steps over it."""
    fresh.setenv("PYTEST_XDIST_WORKER", "gw0")
    fresh.setattr(ports, "_cursor", 10080 - ports.FIRST)
    got = ports.free_port()
    assert got != 10080 and got > 10080
