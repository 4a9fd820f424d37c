"""Where a request's prefix may come from: the candidates the planner chooses among, gathered
from the device copies other sequences hold (other slots, running requests, parked write-backs)
and from the shared tree (resident owners, H, D), and, on a model with sliding-window or
recurrent layers, cut back to the states those copies can really give (server/cache/checkpointed_slots.py).

The planner (server/cache/planner.py) stays pure: it receives the live copies as token lists;
this module is the part that reads the engine's slots and running requests to produce them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

from server.cache.checkpointed_slots import SlotStates
from server.cache.planner import Candidate, Planner
from server.cache.radix_tree import RadixTree
from server.cache.slot_paths import slot_paths
from server.cache.tiers import Source
from server.cache.write_back import WriteBackQueue
from server.engine.scheduler import Admission
from server.engine.sequence import Sequence
from server.engine.slots import SlotPool, common_prefix_len


class CandidateSources:
    """Gathers one admission's candidates (engine thread only)."""

    def __init__(self, *, slots: SlotPool, running: Callable[[], list[Sequence]], enabled: set[Source],
                 tree: RadixTree | None, planner: Planner, parked: WriteBackQueue | None,
                 states: SlotStates | None):
        self.slots, self.running, self.enabled, self.tree = slots, running, enabled, tree
        self.planner, self.parked, self.states = planner, parked, states

    def candidates(self, adm: Admission) -> list[Candidate]:
        """Every source's candidate for the admitted request's cache prompt."""
        if self.states is None:
            return self.planner.candidates(adm.seq.cache_prompt, adm.common_prefix, self._live(adm))
        return self._candidates_with_state(adm)

    def known_prefix(self, adm: Admission, prompt: list[int]) -> int:
        """How far `prompt` follows a path the cache knows: the slot's own, another slot's, the tree's."""
        known = adm.common_prefix
        for slot in self.slots.slots:
            if slot is not adm.slot:
                known = max(known, common_prefix_len(slot.tokens, prompt))
        if self.tree is not None:
            with self.tree.mutex:
                known = max(known, self.tree.match_prefix(prompt, touch=False).longest)
        return min(known, len(prompt) - 1)

    def _candidates_with_state(self, adm: Admission) -> list[Candidate]:
        """On a model with sliding-window or recurrent layers: A as far as the slot's state goes
        back, S the other slot whose copy gives the longest state (cut back, or with a
        checkpoint), H and D as the planner cuts them to a checkpoint."""
        assert self.states is not None
        prompt, limit = adm.seq.cache_prompt, len(adm.seq.prompt) - 1
        a_len, a_ckpt = self.states.resumable(adm.slot, prompt, min(adm.common_prefix, limit))
        s_cand = Candidate(Source.S, 0)
        if Source.S in self.enabled:
            running = {s.slot.index: s for s in self.running() if s.slot is not None and s is not adm.seq}
            for slot in self.slots.slots:
                if slot is adm.slot or (slot.busy and slot.index not in running):
                    continue
                tokens = running[slot.index].kv_tokens() if slot.index in running else slot.tokens
                k, ckpt = self.states.resumable(slot, prompt, min(common_prefix_len(tokens, prompt), limit),
                                                held=len(tokens))
                if k > s_cand.length:
                    s_cand = Candidate(Source.S, k, src_seq=slot.seq_id, checkpoint=ckpt)
        cands = self.planner.candidates(prompt, a_len, ())  # S there: a resident owner's, if any
        owned = self._owner_state(next((c for c in cands if c.source is Source.S), None), prompt)
        if owned.length > s_cand.length:  # another slot's copy wins a tie, as in the planner
            s_cand = owned
        return [replace(c, checkpoint=a_ckpt) if c.source is Source.A else s_cand if c.source is Source.S else c
                for c in cands]

    def _owner_state(self, c: Candidate | None, prompt: list[int]) -> Candidate:
        """A resident owner's candidate cut to a state it can give: all of the owner (its own
        state is the one at its end), a cut back when that is exact, or the newest checkpoint
        the host keeps on the prompt's path."""
        assert self.states is not None
        if c is None or c.owner is None or c.length == 0:
            return Candidate(Source.S, 0)
        held = len(c.owner.tokens)
        if self.states.memory.can_cut(self.states.runtime, c.owner.seq_id, c.length, held):
            return c
        ckpt = self.states.store.best(prompt, c.length) if self.states.store is not None else None
        return replace(c, length=ckpt.pos, checkpoint=ckpt) if ckpt is not None else Candidate(Source.S, 0)

    def _live(self, adm: Admission) -> Iterator[tuple[int, list[int]]]:
        """The device copies other sequences hold: another slot's kept idle KV or computed
        tokens, then the slots' KV parked for write-back (read lazily, by the planner)."""
        for slot, tokens in slot_paths(self.slots, self.running()):
            if slot is not adm.slot:
                yield slot.seq_id, tokens
        for copy in self.parked.queue if self.parked is not None else ():
            yield copy.seq_id, copy.tokens
