"""What each slot's cells hold now, one rule for everyone who asks (the router's candidates, the owners'
charge, the write-back's device depth, the prefetcher's device holder): a running request's computed KV,
an idle slot's kept KV, and nothing for a slot taken by a request not running yet (engine thread)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from server.engine.sequence import Sequence
from server.engine.slots import Slot, SlotPool


def slot_paths(slots: SlotPool, running: Iterable[Sequence]) -> Iterator[tuple[Slot, list[int]]]:
    """(slot, the tokens its cells hold) for every slot; a running request's tokens are read lazily."""
    by_slot = {s.slot.index: s for s in running if s.slot is not None}
    for slot in slots.slots:
        seq = by_slot.get(slot.index)
        yield slot, (seq.kv_tokens() if seq is not None else [] if slot.busy else slot.tokens)
