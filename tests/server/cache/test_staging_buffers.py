"""The kept buffers of staged restores' joins (server/cache/staging_buffers.py)."""

from __future__ import annotations

import numpy as np

from server.cache.staging_buffers import StagingBuffers


def test_a_buffer_given_back_is_taken_again_for_a_state_that_fits():
    pool = StagingBuffers()
    a = pool.take(1000)
    assert a.nbytes == 1000 and pool.allocated == 1
    pool.give(a)
    b = pool.take(600)
    assert b.nbytes == 600 and np.shares_memory(a, b) and pool.reused == 1
    c = pool.take(2000)  # larger than any kept: a new one
    assert not np.shares_memory(b, c) and pool.allocated == 2


def test_the_smallest_buffer_that_fits_is_taken_and_none_is_kept_twice():
    pool = StagingBuffers()
    small, large = pool.take(100), pool.take(10_000)
    pool.give(large)
    pool.give(small)
    pool.give(small)
    assert pool.kept_bytes() == 10_100
    assert np.shares_memory(pool.take(50), small)
    assert np.shares_memory(pool.take(50), large)
    assert pool.kept_bytes() == 0


def test_at_most_keep_bytes_stay_kept_the_largest_going_first():
    pool = StagingBuffers(keep_bytes=5_000)
    bufs = [pool.take(n) for n in (1_000, 2_000, 4_000)]
    for b in bufs:
        pool.give(b)
    assert pool.kept_bytes() == 3_000
