"""kv_format.cut: the one range cutter (host restores, disk and shared-store writes)."""

from __future__ import annotations

from dataclasses import dataclass

from server.cache.kv_format import cut, positioned


@dataclass(frozen=True)
class Seg:
    """Stands for a KVSegment: positions [pos0, pos0 + n_tokens)."""

    pos0: int
    n_tokens: int

    def slice(self, a: int, b: int) -> Seg:
        assert 0 <= a < b <= self.n_tokens
        return Seg(self.pos0 + a, b - a)


def spans(parts):
    return None if parts is None else [(p.pos0, p.pos0 + p.n_tokens) for p in parts]


def test_whole_segments_are_kept_and_the_ends_sliced():
    segs = [Seg(0, 10), Seg(10, 5), Seg(15, 20)]
    ranges = positioned(segs)
    assert [s for s, _ in ranges] == [0, 10, 15]
    assert spans(cut(ranges, 0, 35)) == [(0, 10), (10, 15), (15, 35)]
    assert cut(ranges, 0, 35)[1] is segs[1], "a whole segment is used as it is"
    assert spans(cut(ranges, 4, 20)) == [(4, 10), (10, 15), (15, 20)]
    assert spans(cut(ranges, 12, 13)) == [(12, 13)]
    assert cut(ranges, 7, 7) == []


def test_a_gap_or_a_short_cover_is_none():
    assert cut([(0, Seg(0, 10)), (12, Seg(12, 4))], 5, 14) is None
    assert cut([(0, Seg(0, 10))], 5, 11) is None
    assert cut([(8, Seg(8, 10))], 5, 11) is None
    assert spans(cut([(8, Seg(8, 10))], 8, 11)) == [(8, 11)]
