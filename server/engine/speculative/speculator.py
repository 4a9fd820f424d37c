"""Speculative decoding in the engine's continuous batching: which decoding sequences draft this step, and what
their verification leaves.

`propose` runs after the scheduler planned a step: each decoding sequence that may draft (its request allows it,
the batch has room) gets a draft from the drafter, as long as the policy says it pays; its step item then carries
its last sampled token followed by the draft (k + 1 rows of that sequence, all with logits). The runner verifies
(llama.cpp's rule: a drafted token stands while it equals what the target's sampler picks at its row, so the
output is the target's) and calls `settle` with how many drafted tokens it accepted; the rest never reach the
client, and their KV is removed. The drafter's lanes are the slots (lane = slot index); a lane's history is
begun when a sequence first drafts on it and follows every token the target then keeps.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from server.engine.sequence import SeqStatus, Sequence
from server.engine.speculative.drafter import Drafter, DraftRequest
from server.engine.speculative.policy import DraftPolicy

if TYPE_CHECKING:
    from server.engine.scheduler import StepItem


class Speculator:
    def __init__(self, drafter: Drafter, policy: DraftPolicy):
        self.drafter = drafter
        self.policy = policy
        self._owner: dict[int, int] = {}  # lane -> the id of the sequence whose history it holds
        self._synced: dict[int, int] = {}  # lane -> tokens of that history
        # totals since start (/metrics): drafts made, tokens drafted, tokens accepted
        self.n_drafts = 0
        self.n_drafted = 0
        self.n_accepted = 0

    @staticmethod
    def _allowed(seq: Sequence) -> int:
        """The most tokens `seq` may draft now: its request's limit, and room below max_tokens (the token the
        target samples after the draft must fit too)."""
        limit = seq.request.speculative_n_max
        room = seq.request.max_tokens - len(seq.output) - 1
        return max(0, min(room, limit if limit is not None else room))

    def _lane(self, seq: Sequence) -> int:
        """The sequence's lane, its history begun (a new request) or begun again (a history that went astray)."""
        lane = seq.slot.index
        if self._owner.get(lane) != seq.id or self._synced.get(lane) != seq.n_past:
            self.drafter.begin(lane, (seq.prompt + seq.output)[: seq.n_past])
            self._owner[lane], self._synced[lane] = seq.id, seq.n_past
        return lane

    def propose(self, items: list[StepItem], spare_rows: int) -> None:
        """Extend the decode items of sequences that draft this step with their drafts (at most `spare_rows`
        rows in all)."""
        decoding = [i for i in items if i.sample and len(i.tokens) == 1 and i.seq.status is SeqStatus.DECODING]
        if not decoding or spare_rows <= 0:
            return
        rows = sum(len(i.tokens) for i in items)
        wanted: list[tuple[StepItem, DraftRequest]] = []
        for item in decoding:
            seq = item.seq
            n_max = min(self._allowed(seq), self.drafter.n_max, spare_rows)
            if n_max <= 0:
                continue
            k = self.policy.length(seq.id, n_max, rows, len(decoding))
            if k <= 0:
                continue
            lane = self._lane(seq)
            wanted.append((item, DraftRequest(lane=lane, id_last=item.tokens[0], pos0=item.start_pos, n_max=k)))
            spare_rows -= k
            if spare_rows <= 0:
                break
        if not wanted:
            return
        t0 = time.perf_counter()
        drafts = self.drafter.draft([r for _, r in wanted])
        n_tokens = sum(len(d) for d in drafts)
        self.policy.observe_drafting(n_tokens, time.perf_counter() - t0)
        for (item, _), draft in zip(wanted, drafts):
            if not draft:
                self.policy.observe_empty(item.seq.id)
                continue
            n_min = item.seq.request.speculative_n_min or 0
            if draft and len(draft) >= n_min:
                item.draft = draft
                item.tokens = [item.tokens[0], *draft]

    def settle(self, item: StepItem, n_accepted: int) -> None:
        """The step ran and the runner verified `item`: its first 1 + n_accepted tokens keep their KV."""
        seq = item.seq
        lane = seq.slot.index if seq.slot is not None else None
        if lane is None or self._owner.get(lane) != seq.id:
            return  # a sequence that never drafted has no history to follow
        kept = item.tokens[: 1 + n_accepted]
        self.drafter.push(lane, kept)
        self._synced[lane] = self._synced.get(lane, 0) + len(kept)
        if item.draft:
            self.drafter.accept(lane, n_accepted)
            self.policy.observe_draft(seq.id, len(item.draft), n_accepted)
            seq.n_drafted += len(item.draft)
            seq.n_draft_accepted += n_accepted
            self.n_drafts += 1
            self.n_drafted += len(item.draft)
            self.n_accepted += n_accepted

    def observe_step(self, rows: int, seconds: float) -> None:
        self.policy.observe_step(rows, seconds)

    def release(self, seq: Sequence) -> None:
        """The sequence ended: its lane's history is no longer followed."""
        self.policy.forget(seq.id)
        if seq.slot is not None and self._owner.get(seq.slot.index) == seq.id:
            del self._owner[seq.slot.index]
            self._synced.pop(seq.slot.index, None)

    def close(self) -> None:
        self.drafter.close()
