"""The speculator (server/engine/speculative/speculator.py) with a scripted drafter: which decoding sequences
draft, within which limits, and what a verified step leaves in the drafter's lanes and the counts."""

from __future__ import annotations

from dataclasses import dataclass, field

from server.engine.sampling_params import SamplingParams
from server.engine.scheduler import StepItem
from server.engine.sequence import GenerationRequest, SeqStatus, Sequence
from server.engine.slots import Slot
from server.engine.speculative.drafter import DraftRequest
from server.engine.speculative.policy import DraftPolicy
from server.engine.speculative.speculator import Speculator


@dataclass
class ScriptedDrafter:
    """Drafts `script` (cut to each request's n_max) and records every call."""

    script: list[int] = field(default_factory=lambda: [7, 8, 9, 10])
    n_max: int = 16
    types: tuple = ("ngram-map-k",)
    calls: list = field(default_factory=list)

    def begin(self, lane, tokens):
        self.calls.append(("begin", lane, list(tokens)))

    def push(self, lane, tokens):
        self.calls.append(("push", lane, list(tokens)))

    def draft(self, requests: list[DraftRequest]) -> list[list[int]]:
        self.calls.append(("draft", [(r.lane, r.id_last, r.pos0, r.n_max) for r in requests]))
        return [self.script[: r.n_max] for r in requests]

    def accept(self, lane, n):
        self.calls.append(("accept", lane, n))

    def close(self):
        pass


def decoding(prompt: list[int], output: list[int], *, lane: int = 0, max_tokens: int = 100, **request) -> Sequence:
    seq = Sequence(GenerationRequest(prompt_tokens=prompt, sampling=SamplingParams(temperature=0.0),
                                     max_tokens=max_tokens, **request), lambda e: None)
    seq.slot = Slot(index=lane, seq_id=lane)
    seq.status = SeqStatus.DECODING
    seq.output = list(output)
    seq.n_past = len(prompt) + len(output) - 1
    return seq


def step_item(seq: Sequence) -> StepItem:
    return StepItem(seq, [seq.output[-1]], seq.n_past, sample=True)


def always(drafter) -> Speculator:
    return Speculator(drafter, DraftPolicy(adaptive=False))


def test_a_decoding_sequence_gets_its_draft_after_its_last_token():
    drafter = ScriptedDrafter()
    spec = always(drafter)
    seq = decoding([1, 2, 3], [4])
    item = step_item(seq)
    spec.propose([item], spare_rows=100)
    assert item.tokens == [4, 7, 8, 9, 10] and item.draft == [7, 8, 9, 10]
    assert ("begin", 0, [1, 2, 3]) in drafter.calls  # the history: the tokens the target holds
    assert ("draft", [(0, 4, 3, 16)]) in drafter.calls


def test_limits_room_below_max_tokens_the_request_and_the_batch():
    spec = always(ScriptedDrafter(script=list(range(50, 66))))
    near_end = step_item(decoding([1, 2], [3, 4, 5], max_tokens=6))  # room for 2 drafted + 1 sampled
    capped = step_item(decoding([1, 2], [3], lane=1, speculative_n_max=3))
    off = step_item(decoding([1, 2], [3], lane=2, speculative_n_max=0))
    spec.propose([near_end, capped, off], spare_rows=100)
    assert near_end.draft == [50, 51] and capped.draft == [50, 51, 52] and off.draft == []
    tight = step_item(decoding([1, 2], [3], lane=3))
    spec.propose([tight], spare_rows=2)
    assert tight.draft == [50, 51]


def test_a_draft_shorter_than_the_requests_n_min_is_not_verified():
    spec = always(ScriptedDrafter(script=[7, 8]))
    item = step_item(decoding([1, 2], [3], speculative_n_min=3))
    spec.propose([item], spare_rows=100)
    assert item.draft == [] and item.tokens == [3]


def test_prompt_chunks_never_draft():
    spec = always(ScriptedDrafter())
    seq = decoding([1, 2, 3, 4], [])
    seq.status = SeqStatus.PREFILLING
    chunk = StepItem(seq, [3, 4], 2, sample=True)
    spec.propose([chunk], spare_rows=100)
    assert chunk.draft == []


def test_settle_pushes_what_the_target_kept_and_counts_the_accepted():
    drafter = ScriptedDrafter()
    spec = always(drafter)
    seq = decoding([1, 2, 3], [4])
    item = step_item(seq)
    spec.propose([item], spare_rows=100)
    spec.settle(item, n_accepted=2)
    assert ("push", 0, [4, 7, 8]) in drafter.calls and ("accept", 0, 2) in drafter.calls
    assert (seq.n_drafted, seq.n_draft_accepted) == (4, 2)
    assert (spec.n_drafts, spec.n_drafted, spec.n_accepted) == (1, 4, 2)
    # the next step continues the same history (no new begin) ...
    seq.n_past += 3
    seq.output += [7, 8, 11]
    drafter.calls.clear()
    spec.propose([step_item(seq)], spare_rows=100)
    assert not [c for c in drafter.calls if c[0] == "begin"]
    # ... and a step without a draft still pushes its token
    plain = step_item(seq)
    spec.settle(plain, n_accepted=0)
    assert ("push", 0, [11]) in drafter.calls


def test_a_new_request_on_the_slot_begins_its_lane_again():
    drafter = ScriptedDrafter()
    spec = always(drafter)
    first = decoding([1, 2, 3], [4])
    spec.propose([step_item(first)], spare_rows=100)
    spec.release(first)
    second = decoding([9, 9], [5])
    drafter.calls.clear()
    spec.propose([step_item(second)], spare_rows=100)
    assert drafter.calls[0] == ("begin", 0, [9, 9])


def test_a_sequence_that_never_drafted_pushes_nothing():
    drafter = ScriptedDrafter()
    spec = always(drafter)
    seq = decoding([1, 2], [3], speculative_n_max=0)
    item = step_item(seq)
    spec.propose([item], spare_rows=100)
    spec.settle(item, n_accepted=0)
    assert drafter.calls == []
