"""next_piece: a restore cut into pieces of whole tokens (server/cache/restore_pieces.py)."""

from __future__ import annotations

from collections import deque

import numpy as np

from server.cache.kv_format import KVLayout, KVSegment
from server.cache.restore_pieces import next_piece


def _segment(pos0: int, n: int, row_bytes: int = 8) -> KVSegment:
    layout = KVLayout(v_trans=False, k_types=(1,), k_row_bytes=(row_bytes,), v_types=(1,), v_row_bytes=(row_bytes,),
                      v_el_bytes=(0,))
    k = [np.arange(n * row_bytes, dtype=np.uint8).reshape(n, row_bytes)]
    v = [np.arange(n * row_bytes, dtype=np.uint8).reshape(n, row_bytes)]
    return KVSegment(layout, pos0, k, v)


def test_whole_segments_without_a_budget_and_what_is_held_skipped():
    pending = deque([_segment(0, 4), _segment(4, 6)])
    first = next_piece(pending, 2, None)
    assert (first.pos0, first.n_tokens) == (2, 2)  # positions [0, 2) are held already
    second = next_piece(pending, 4, None)
    assert (second.pos0, second.n_tokens) == (4, 6)
    assert next_piece(pending, 10, None) is None


def test_a_budget_cuts_whole_tokens_and_keeps_the_rest_first():
    pending = deque([_segment(10, 10)])  # 16 bytes a token
    piece = next_piece(pending, 10, 50)
    assert (piece.pos0, piece.n_tokens) == (10, 3)
    rest = next_piece(pending, 13, None)
    assert (rest.pos0, rest.n_tokens) == (13, 7)
    tiny = deque([_segment(0, 5)])
    assert next_piece(tiny, 0, 1).n_tokens == 1, "at least one token, however small the budget"
