"""Tier S (resident): owner sequences that keep finished common prefixes in the unified KV.

An owner is a llama.cpp sequence that holds the cells of one prefix, positions [0, n). A
request attaches by `seq_cp(owner, slot, 0, n)`: in a unified KV that adds the slot's id
to the same cells, so one physical copy serves every reader. Owners are published
incrementally: a new owner first attaches the cells of the existing owner it shares the
longest prefix with, then takes only the new positions from the finished request. So the
cells the owners hold are exactly the distinct token positions of their prefixes (the
union bound), and that is what the budget charges. Eviction removes an owner's sequence;
its cells are freed only where no slot or other owner still holds them.

In the split KV layout (server/engine/kv_layout.py) each owner is a stream of its own: publishing
copies the finished slot's stream and trims it to the prefix (`copy_prefix`), and a request
takes an owner's prefix by the same copy, so owners share no cells: each holds its whole
prefix, and the budget charges the copies, the sum of their lengths (`copies=True`).

What the budget charges in the unified layout: the owners' cells that no slot (running or idle) and no
parked copy also holds (`device_paths`, set by the router). A cell an owner shares with a slot is one
cell, already paid for by the slots' context (--ctx-size); it becomes the owners' to pay for when that
slot lets it go (the slot taken for another prompt), and then `enforce` evicts, lowest ranked first,
owners whose removal frees cells, until the charge is within the budget again. So a finished request's
path is published whole at no charge while its slot keeps it, and the device keeps, beyond the running
requests, `budget_cells` of finished paths ranked by the policy (the simulator's device: bench/cachesim/).
Without `device_paths` (and in the split layout, or with partial states) every held cell is charged.

Owners are indexed by the radix tree the stored tiers share (server/cache/radix_tree.py):
each is a *holder* of the nodes on its path, so a lookup is one walk of the tree (no
scan of the owners), and the cells the owners hold together are the tree's
`held_tokens`. Every use of the tree holds `tree.mutex`.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, cast

from server.cache.checkpoints import StateCheckpoint
from server.cache.lifecycle import CacheHint, SessionRegistry
from server.cache.radix_tree import MatchResult, RadixNode, RadixTree
from server.cache.tiers import Source
from server.engine.llama_runtime import LlamaRuntime
from server.engine.seq_ids import SequenceIdPool, SequenceIdsExhausted
from server.engine.slots import common_prefix_len

log = logging.getLogger(__name__)
_stamps = itertools.count(1)


@dataclass(eq=False)
class Owner:
    seq_id: int
    tokens: list[int]
    tip: RadixNode  # the tree node its path ends at (it holds that node and its ancestors)
    last_used: int = field(default_factory=lambda: next(_stamps))
    sessions: set[str] = field(default_factory=set)
    attaches: int = 0
    prefetched: int = 0  # tokens a prefetch restored into it that no request has attached yet


def union_positions(prefixes: list[list[int]]) -> int:
    """Distinct (token path) positions of a set of prefixes: the nodes of their trie."""
    ordered = sorted(tuple(p) for p in prefixes)
    total = sum(len(p) for p in ordered)
    for a, b in zip(ordered, ordered[1:]):
        total -= common_prefix_len(list(a), list(b))
    return total


class ResidentOwners:
    source = Source.S

    def __init__(self, tree: RadixTree, runtime: LlamaRuntime, seq_ids: SequenceIdPool, budget_cells: int,
                 registry: SessionRegistry, on_evict: Callable[[int, list[int], set[str]], None] | None = None,
                 partial_state: bool = False, copies: bool = False):
        """`partial_state`: the model has sliding-window or recurrent layers (an owner's window
        cells or recurrent state are those at its end; publish takes a checkpoint). `copies`: the
        split KV layout, where an owner holds a copy of its whole prefix in a stream of its own."""
        self.partial_state = partial_state
        self.copies = copies
        self.tree = tree
        self.runtime = runtime
        self.seq_ids = seq_ids
        self.budget_cells = budget_cells
        self.registry = registry
        self.owners: list[Owner] = []
        self._by_seq: dict[int, Owner] = {}
        # Called with (seq_id, tokens, sessions) before an evicted owner's cells are dropped (write-back).
        self.on_evict = on_evict
        self.hits = 0
        self.evictions = 0
        self.publishes = 0
        self.prefetch_hits = self.prefetch_misses = 0  # prefetched tokens then attached / evicted unused
        # the cache policy's order of owners (server/cache/policy_choice.py); None: the lifecycle classes
        self.rank: Callable[[Owner], Any] | None = None
        # the token paths the slots and parked copies hold in the unified KV (see the module docstring)
        self.device_paths: Callable[[], Iterable[list[int]]] | None = None
        self.enforced = 0  # owners evicted because a slot let go of cells they share
        self.charged = 0  # the cells charged at the last count (read by stats from another thread)

    # ----------------------------------------------------------------- lookup
    def take(self, m: MatchResult, exclude: int | None = None) -> tuple[int, Owner | None]:
        """The longest prefix of a match of the tree that an owner (not `exclude`) holds,
        and that owner (caller holds `tree.mutex`)."""
        span = m.held_span()
        nodes = ((span.partial_node,) if span.partial_node is not None else ()) + span.nodes[::-1]
        n = span.longest
        for node in nodes:  # deepest first: a holder there holds everything above
            holders = node.holders - {exclude}
            if holders:
                # the most recently used of equals: it is the one LRU keeps longest
                return n, max((self._by_seq[h] for h in holders), key=lambda o: o.last_used)
            n -= span.partial_tokens if node is span.partial_node else len(node.key)
        return 0, None

    def best(self, tokens: list[int], exclude: int | None = None) -> tuple[int, Owner | None]:
        with self.tree.mutex:
            return self.take(self.tree.match_prefix(tokens, touch=False), exclude)

    def holds(self, tokens: list[int], exclude: int | None = None) -> bool:
        """Whether an owner (other than `exclude`) holds all of `tokens`."""
        return self.best(tokens, exclude)[0] == len(tokens)

    def note_attach(self, owner: Owner) -> None:
        """A request attached this owner: count the hit and refresh its place in the LRU order."""
        owner.attaches += 1
        owner.last_used = next(_stamps)
        self.hits += 1
        if owner.prefetched:
            log.debug("resident owner of %s attached: %d prefetched tokens used", sorted(owner.sessions),
                      owner.prefetched)
            self.prefetch_hits += owner.prefetched
            owner.prefetched = 0

    def held_cells(self) -> int:
        """The cells the owners hold: the union of their prefixes (unified: they share cells), or the sum of
        their copies (split)."""
        if self.copies:
            return sum(len(o.tokens) for o in tuple(self.owners))
        return self.tree.held_tokens

    def _charges_shared(self) -> bool:
        return self.device_paths is not None and not self.copies and not self.partial_state

    def _covered(self) -> tuple[int, set[int]]:
        """The owners' cells a slot or parked copy also holds, and the ids of the owner nodes wholly held so."""
        assert self.device_paths is not None
        covered: dict[int, int] = {}  # id(node) -> its leading tokens a device path covers
        whole: set[int] = set()
        with self.tree.mutex:
            for path in self.device_paths():
                if not path:
                    continue
                m = self.tree.match_prefix(path, touch=False)
                for node in m.path:
                    if node.holders:
                        covered[id(node)] = len(node.key)
                        whole.add(id(node))
                part = m.partial_node
                if part is not None and part.holders and m.partial_tokens > covered.get(id(part), 0):
                    covered[id(part)] = m.partial_tokens
        return sum(covered.values()), whole

    def _charge(self) -> tuple[int, set[int]]:
        """The cells the budget charges (module docstring): the held cells, less those a slot or parked copy
        also holds in the unified layout; and there, the ids of the owner nodes a device path holds whole."""
        n, whole = self.held_cells(), set[int]()
        if self._charges_shared() and n:
            covered, whole = self._covered()
            n -= covered
        self.charged = n
        return n, whole

    def cells(self) -> int:
        return self._charge()[0]

    def _new_cells(self, n: int, base_n: int) -> int:
        """The cells publishing an n-token prefix adds: past the longest owner it extends (unified), or all n."""
        return n if self.copies else n - base_n

    def _over_budget_with(self, cells: int) -> bool:
        """Whether `cells` more held cells would take the charge past the budget now. Charging shared cells,
        a publish's cells are its slot's until the slot lets them go (then `enforce` keeps the budget)."""
        return not self._charges_shared() and self.cells() + cells > self.budget_cells

    def _freeing(self, whole: set[int]) -> list[Owner]:
        """The owners whose eviction frees charged cells: charging shared cells, those whose path's end no
        slot or parked copy holds (`whole`, from `_charge`: one that does holds the whole path); else every one."""
        if not self._charges_shared():
            return list(self.owners)
        return [o for o in self.owners if id(o.tip) not in whole]

    def enforce(self, protect: Owner | None = None) -> int:
        """Evict owners (not `protect`), the policy's lowest ranked first among those whose eviction frees
        charged cells, until the charge is within the budget; the number evicted. Run after a slot let go
        of cells (the router: after an admission, after each engine step) and after a prefetch adopts."""
        evicted = 0
        while self.owners:
            charged, whole = self._charge()  # one walk per eviction: the charge and who frees any of it
            if charged <= self.budget_cells:
                break
            ranked = [(r, o) for o in self._freeing(whole) if o is not protect and (r := self._rank(o)) is not None]
            if not ranked:
                break
            self._evict(min(ranked, key=lambda x: x[0])[1], "over the budget")
            evicted += 1
        if self._charges_shared():
            self.enforced += evicted
        return evicted

    # ---------------------------------------------------------------- publish
    def publish(self, tokens: list[int], src_seq: int, hint: CacheHint | None,
                checkpoint: StateCheckpoint | None = None) -> Owner | None:
        """Keep tokens[0:n] (held by `src_seq`) resident; None if it does not fit the budget.
        On a model with sliding-window or recurrent layers, `checkpoint` is the state after
        exactly those tokens (restored over the owner's partial state); None there means the
        copy from `src_seq` already is that state (src_seq can be cut back to n)."""
        n = len(tokens)
        base_n, base = self.best(tokens)
        if base is not None and base_n == n:
            base.last_used = next(_stamps)
            self._tag(base, hint)
            return base
        if self._new_cells(n, base_n) > self.budget_cells:
            return None
        # only owners that rank below the newcomer make room for it (LRU: every one; a value policy: those
        # its sessions' expected reuse outweighs), else it is not kept: the device keeps what is worth most
        newcomer = self._rank(Owner(-1, [], cast(RadixNode, None), sessions={hint.session} if hint and hint.session
                                    else set()))
        while self._over_budget_with(self._new_cells(n, base_n)) or self.seq_ids.in_use("owner") >= \
                self.seq_ids.layout.owners:
            if not self.evict_one(protect=None if self.copies else base, why="publish", below=newcomer):
                return None
            base_n, base = self.best(tokens)
        try:
            sid = self.seq_ids.take("owner")
        except SequenceIdsExhausted:
            return None
        if self.copies:  # a stream of its own: a copy of the slot's, trimmed to the prefix
            self.runtime.copy_prefix(src_seq, sid, n)
        else:
            if base is not None and base_n > 0:
                self.runtime.seq_cp(base.seq_id, sid, 0, base_n)
            self.runtime.seq_cp(src_seq, sid, base_n, n)
        if checkpoint is not None and (checkpoint.pos != n
                                       or not self.runtime.state_seq_set(checkpoint.blob, sid, partial=True)):
            log.warning("resident publish: the state at %d could not be restored; dropped", n)
            self.runtime.seq_rm(sid, -1, -1)
            self.seq_ids.give("owner", sid)
            return None
        # (llama.cpp's seq_pos_min is the window's or the recurrent state's on those models, not 0)
        if self.runtime.seq_pos_max(sid) != n - 1 or (self.runtime.seq_pos_min(sid) != 0 and not self.partial_state):
            log.warning("resident publish produced an incomplete owner; dropped")
            self.runtime.seq_rm(sid, -1, -1)
            self.seq_ids.give("owner", sid)
            return None
        owner = self._register(tokens, sid)
        self._tag(owner, hint)
        self.publishes += 1
        return owner

    def _register(self, tokens: list[int], sid: int) -> Owner:
        """Make `sid`, which holds tokens[0:n], an owner on the tree; owners it extends go (redundant)."""
        with self.tree.mutex:
            tip = self.tree.insert(tokens).last_node  # a node ends exactly at n
            self.tree.add_holder(tip, sid)
            # An owner whose prefix the new one extends is now redundant: the new one holds it all.
            redundant = [self._by_seq[h] for node in tip.iter_up() for h in node.holders
                         if h != sid and self._by_seq[h].tip is node]
        owner = Owner(sid, list(tokens), tip)
        for old in redundant:
            owner.prefetched += old.prefetched  # its unused prefetched tokens are the new one's now
            self._remove(old)
        self.owners.append(owner)
        self._by_seq[sid] = owner
        return owner

    # ---------------------------------------------------------------- prefetch (server/cache/prefetch.py)
    def owner_of(self, seq_id: int) -> Owner | None:
        return self._by_seq.get(seq_id)

    def make_room(self, cells: int, *, below: float, protect: Owner | None = None) -> bool:
        """Room for `cells` more cells and one more owner id, evicting only owners whose rank's value
        is below `below` (the policy's keys: (value, last used)) and that hold no prefetched tokens yet
        unused (prefetches do not displace each other: near values would make them take turns); False
        when that is not enough."""
        if cells > self.budget_cells:
            return False
        while True:
            charged, whole = self._charge()
            if charged + cells <= self.budget_cells and self.seq_ids.in_use("owner") < self.seq_ids.layout.owners:
                break
            candidates = self.owners if charged + cells <= self.budget_cells else self._freeing(whole)  # an id
            ranked = [(r, o) for o in candidates if o is not protect and not o.prefetched
                      and (r := self._rank(o)) is not None and isinstance(r, tuple) and r[0] < below]
            if not ranked:
                return False
            self._evict(min(ranked, key=lambda x: x[0])[1], "prefetch")
        return True

    def adopt(self, tokens: list[int], sid: int, session: str, brought_up: int) -> Owner | None:
        """Make `sid` (built by a prefetch: it holds tokens[0:n], `brought_up` of them restored) an owner
        of `session`; None when its cells are not exactly that (the caller clears and gives back `sid`)."""
        n = len(tokens)
        if self.runtime.seq_pos_max(sid) != n - 1 or self.runtime.seq_pos_min(sid) != 0:
            log.warning("prefetch built an incomplete owner; dropped")
            return None
        owner = self._register(tokens, sid)
        owner.sessions.add(session)
        owner.prefetched += brought_up
        self.enforce(protect=owner)  # others published meanwhile: back within the budget
        return owner

    def _tag(self, owner: Owner, hint: CacheHint | None) -> None:
        if hint is not None and hint.session:
            owner.sessions.add(hint.session)

    # --------------------------------------------------------------- eviction
    def _rank(self, owner: Owner) -> Any:
        """The policy's order (`rank`), else lifecycle-aware: pinned never, finished sessions first,
        tool waits last."""
        if self.rank is not None:
            return self.rank(owner)
        states = [self.registry.state(s) for s in owner.sessions]
        if any(self.registry.is_pinned(s) for s in owner.sessions):
            return None
        if "tool_wait" in states:
            cls = 2
        elif states and all(s == "done" for s in states):
            cls = 0
        else:
            cls = 1
        return cls, owner.last_used

    def evict_one(self, protect: Owner | None = None, why: str = "room", below: Any = None) -> bool:
        """Drop the owner that matters least (see _rank); with `below` (a rank key), only one ranked below it;
        False when none may go."""
        ranked = [(r, o) for o in self.owners if o is not protect and (r := self._rank(o)) is not None
                  and (below is None or r < below)]
        if not ranked:
            return False
        _, victim = min(ranked, key=lambda x: x[0])  # one policy's keys compare
        self._evict(victim, why)
        return True

    def _evict(self, victim: Owner, why: str) -> None:
        if self.on_evict is not None:
            self.on_evict(victim.seq_id, victim.tokens, set(victim.sessions))
        if victim.prefetched:  # brought up, never used
            log.debug("resident owner of %s evicted (%s) with %d prefetched tokens unused (rank %s)",
                      sorted(victim.sessions), why, victim.prefetched, self._rank(victim))
            self.prefetch_misses += victim.prefetched
        self._remove(victim)
        self.evictions += 1

    def _remove(self, owner: Owner) -> None:
        self.runtime.seq_rm(owner.seq_id, -1, -1)
        if self.runtime.seq_pos_max(owner.seq_id) != -1:
            log.error("resident owner %d still holds cells after removal", owner.seq_id)
        self.seq_ids.give("owner", owner.seq_id)
        with self.tree.mutex:
            self.tree.remove_holder(owner.tip, owner.seq_id)
        self.owners.remove(owner)
        self._by_seq.pop(owner.seq_id, None)

    def flush(self) -> int:
        cells = self.held_cells()
        for owner in list(self.owners):
            self._remove(owner)
        return cells

    def stats(self) -> dict:
        owners = tuple(self.owners)  # read from the event loop while the engine may change the list
        return {"entries": len(owners), "tokens": sum(len(o.tokens) for o in owners),
                "cells": self.held_cells(), "charged_cells": self.charged if self._charges_shared()
                else self.held_cells(), "budget_cells": self.budget_cells, "hits": self.hits,
                "evictions": self.evictions, "evictions_for_shared_cells": self.enforced,
                "publishes": self.publishes}
