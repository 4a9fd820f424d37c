"""What the resident owners' budget charges in the unified layout (server/cache/resident.py): the cells no
slot or parked copy also holds. A finished request's path published while its slot keeps it costs nothing;
when the slot lets go, `enforce` evicts owners whose eviction frees cells, lowest ranked first, and writes
them back. The runtime is a stand-in tracking positions; the tree, ids and registry are the real ones."""

from __future__ import annotations

from server.cache.lifecycle import CacheHint, SessionRegistry
from server.cache.radix_tree import RadixTree
from server.cache.resident import ResidentOwners
from server.engine.seq_ids import SequenceIdLayout, SequenceIdPool
from tests.server.cache.test_resident_value import VALUES, Positions, path

SYSTEM = path(1, 40)  # a prefix every path shares


def owners(budget: int, device: list[list[int]] | None) -> tuple[ResidentOwners, list[list[int]]]:
    """Owners over a slot holding every position; `device`: the paths the slots hold (None: not wired)."""
    runtime = Positions()
    runtime.held[0] = set(range(400))
    evicted: list[list[int]] = []
    res = ResidentOwners(RadixTree(), runtime, SequenceIdPool(SequenceIdLayout(slots=1, owners=8, scratch=0)),  # type: ignore[arg-type]
                         budget, SessionRegistry(), on_evict=lambda _seq, tokens, _sessions: evicted.append(tokens))
    res.rank = lambda o: (max((VALUES[s] for s in o.sessions), default=0.0), o.last_used)
    if device is not None:
        res.device_paths = lambda: device
    return res, evicted


def test_a_path_its_slot_still_holds_is_published_at_no_charge():
    device: list[list[int]] = []
    res, _ = owners(budget=100, device=device)
    a = SYSTEM + path(100, 50)
    device[:] = [a]
    assert res.publish(a, 0, CacheHint(session="later")) is not None
    assert res.held_cells() == 90 and res.cells() == 0, "the slot's cells are the owner's too"
    b = SYSTEM + path(200, 50)
    device[:] = [b]  # the slot took another prompt: a's own 50 cells are the owners' now
    assert res.publish(b, 0, CacheHint(session="due")) is not None
    assert res.cells() == 50 and res.enforce() == 0, "within the budget: both kept"
    assert [sorted(o.sessions) for o in res.owners] == [["later"], ["due"]]


def test_when_a_slot_lets_go_the_lowest_ranked_owner_that_frees_cells_goes_and_is_written_back():
    device: list[list[int]] = []
    res, evicted = owners(budget=90, device=device)
    a, b, c = (SYSTEM + path(first, 50) for first in (100, 200, 300))
    device[:] = [a]
    res.publish(a, 0, CacheHint(session="due"))
    device[:] = [b]
    res.publish(b, 0, CacheHint(session="later"))
    device[:] = [c]  # b let go too: a's 50 and b's 50 cells are charged, 100 > 90
    assert res.cells() == 100
    assert res.enforce() == 1 and evicted == [b], "the one worth less goes, written back first"
    assert res.cells() == 50 and res.stats()["evictions_for_shared_cells"] == 1
    device[:] = [a, c]  # a slot holds a again: a frees nothing, so nothing is evicted for it
    res.budget_cells = 0
    assert res.enforce() == 0 and [sorted(o.sessions) for o in res.owners] == [["due"]]


def test_a_path_longer_than_the_budget_is_not_published_even_while_its_slot_holds_it():
    device: list[list[int]] = []
    res, _ = owners(budget=60, device=device)
    long = SYSTEM + path(100, 80)
    device[:] = [long]
    assert res.publish(long, 0, CacheHint(session="due")) is None, "it could not stay once its slot lets go"


def test_without_the_slots_paths_every_held_cell_is_charged():
    res, evicted = owners(budget=60, device=None)
    a, b = path(100, 50), path(200, 50)
    assert res.publish(a, 0, CacheHint(session="later")) is not None
    assert res.cells() == 50
    assert res.publish(b, 0, CacheHint(session="due")) is not None, "a newcomer worth more takes the room"
    assert evicted == [a] and res.cells() == 50 and res.enforce() == 0
