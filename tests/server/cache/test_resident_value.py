"""Resident owners under a value policy (issue 58): a newcomer takes the room of owners ranked below it only,
and a prefetch displaces neither a more valuable owner nor another prefetch's unused KV (server/cache/resident.py).
The runtime is a stand-in that tracks each sequence's positions; the tree, ids and registry are the real ones."""

from __future__ import annotations

from server.cache.lifecycle import CacheHint, SessionRegistry
from server.cache.radix_tree import RadixTree
from server.cache.resident import ResidentOwners
from server.engine.seq_ids import SequenceIdLayout, SequenceIdPool


class Positions:
    """seq_cp / seq_rm / seq_pos_max / seq_pos_min over position ranges (cells shared by a copy)."""

    def __init__(self) -> None:
        self.held: dict[int, set[int]] = {}

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        self.held.setdefault(dst, set()).update(p for p in self.held.get(src, set()) if p0 <= p < p1)

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        self.held[seq] = set() if p0 < 0 else {p for p in self.held.get(seq, set()) if p < p0}
        return True

    def seq_pos_max(self, seq: int) -> int:
        return max(self.held.get(seq, set()), default=-1)

    def seq_pos_min(self, seq: int) -> int:
        return min(self.held.get(seq, set()), default=-1)


VALUES = {"due": 0.9, "later": 0.2, "soon": 0.6}


def owners(budget: int = 100) -> tuple[ResidentOwners, Positions]:
    runtime = Positions()
    ids = SequenceIdPool(SequenceIdLayout(slots=1, owners=8, scratch=0))
    res = ResidentOwners(RadixTree(), runtime, ids, budget, SessionRegistry())  # type: ignore[arg-type]
    res.rank = lambda o: (max((VALUES[s] for s in o.sessions), default=0.0), o.last_used)
    runtime.held[0] = set(range(200))  # the slot: every position a test publishes from
    return res, runtime


def path(first: int, n: int) -> list[int]:
    return list(range(first, first + n))


def test_a_newcomer_worth_less_than_every_owner_is_not_kept():
    res, _ = owners()
    assert res.publish(path(1000, 60), 0, CacheHint(session="due")) is not None
    assert res.publish(path(2000, 60), 0, CacheHint(session="later")) is None, "it would evict what is due"
    assert [sorted(o.sessions) for o in res.owners] == [["due"]]
    assert res.publish(path(3000, 60), 0, CacheHint(session="soon")) is None
    res.rank = lambda o: (o.last_used,)  # LRU: the newest always comes in
    assert res.publish(path(4000, 60), 0, CacheHint(session="later")) is not None
    assert [sorted(o.sessions) for o in res.owners] == [["later"]]


def test_a_newcomer_worth_more_takes_the_room_of_those_worth_less():
    res, _ = owners()
    res.publish(path(1000, 60), 0, CacheHint(session="later"))
    assert res.publish(path(2000, 60), 0, CacheHint(session="due")) is not None
    assert [sorted(o.sessions) for o in res.owners] == [["due"]] and res.evictions == 1


def test_a_prefetch_takes_room_from_cheaper_owners_only_and_never_from_another_prefetch():
    res, runtime = owners()
    res.publish(path(1000, 40), 0, CacheHint(session="later"))
    sid = res.seq_ids.take("owner")
    runtime.seq_cp(0, sid, 0, 70)
    assert res.make_room(70, below=0.6)  # 40 + 70 cells > 100: "later" (0.2) goes
    owner = res.adopt(path(0, 70), sid, "soon", brought_up=70)
    assert owner is not None and [sorted(o.sessions) for o in res.owners] == [["soon"]]
    assert not res.make_room(60, below=0.99), "an unused prefetch is not displaced by another"
    assert not res.make_room(60, below=0.5), "nor by a prefetch worth less"
    res.note_attach(owner)
    assert res.prefetch_hits == 70 and res.prefetch_misses == 0
    assert res.make_room(60, below=0.99), "once used, it ranks as any owner"
    assert res.owners == [] and res.seq_ids.in_use("owner") == 0
