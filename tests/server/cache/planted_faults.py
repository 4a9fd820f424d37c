"""Faults put into the cache's restores on purpose, for the controls of the cache-on / cache-off
comparison: each wraps one model's `router.kv.restore` and `router.kv.joined` / `stage` (server/cache/kv_ops.py),
the steps every H, D and R reuse goes through (whole, or staged and written beside the compute), and counts the
restores it spoiled. Production code has no hook.

- `shift_by_one`: the restored segment's keys are those of one position earlier (what restoring
  a segment one position off, with llama.cpp's rotation of K, gives): the segment is restored
  one position later and moved back with llama_memory_seq_add, which rotates its K by -1.
- `stale_cell`: one cell in the middle of the restored range holds another prompt's K and V
  for that position (a cell not overwritten, or taken from the wrong segment).

A checkpoint from the wrong prefix is planted where checkpoints are compared
(tests/server/cache/test_checkpoints_real.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from server.cache.kv_format import KVSegment


@dataclass
class Planted:
    name: str
    spoiled: int = 0  # restores this fault changed


def shift_by_one(model) -> Planted:
    import llama_cpp

    kv, rt = model.router.kv, model.runtime
    real = kv.restore
    planted = Planted("shift_by_one")

    def restore(segments, target, checkpoint=None):
        start = segments[0].pos0
        end = start + sum(s.n_tokens for s in segments)
        later = [replace(s, pos0=s.pos0 + 1, blob=None) for s in segments]
        result = real(later, target, checkpoint)  # cells at [start + 1, end + 1)
        llama_cpp.llama_memory_seq_add(rt.memory, target, start + 1, end + 1, -1)
        planted.spoiled += 1
        return result

    real_joined, real_stage = kv.joined, kv.stage

    def joined(segments):  # staged: the state joined one position later ...
        return real_joined([replace(s, pos0=s.pos0 + 1, blob=None) for s in segments])

    def stage(joined, target):  # ... and moved back once its cells are taken
        result = real_stage(joined, target)
        llama_cpp.llama_memory_seq_add(rt.memory, target, joined.start, joined.end, -1)
        planted.spoiled += 1
        return result

    kv.restore, kv.joined, kv.stage = restore, joined, stage
    return planted


def stale_cell(model, donor: KVSegment) -> Planted:
    """`donor`: another prompt's KV from position 0 (e.g. `extract_prefix`), long enough to hold
    a cell at the middle of every restore."""
    kv = model.router.kv
    real, real_joined = kv.restore, kv.joined
    planted = Planted("stale_cell")

    def spoiled(segments):
        seg = KVSegment.join(segments).compact()  # arrays of its own: the tier's copy stays right
        at = seg.n_tokens // 2
        pos = seg.pos0 + at
        if pos < donor.pos0 + donor.n_tokens:
            d = pos - donor.pos0
            for mine, theirs in zip(seg.k, donor.k):
                mine[at] = theirs[d]
            for mine, theirs in zip(seg.v, donor.v):
                if seg.layout.v_trans:
                    mine[:, at] = theirs[:, d]
                else:
                    mine[at] = theirs[d]
            planted.spoiled += 1
        return [seg]

    def restore(segments, target, checkpoint=None):
        return real(spoiled(segments), target, checkpoint)

    def joined(segments):  # a staged restore's state (on the join thread)
        return real_joined(spoiled(segments))

    kv.restore, kv.joined = restore, joined
    return planted


def extract_prefix(model, tokens: list[int]) -> KVSegment:
    """The KV of `tokens` as the model computes them (one generated token, then read back from the
    slot that holds them)."""
    from tests.server.cache.engine_harness import generate

    generate(model, tokens, max_tokens=1)

    def read() -> KVSegment:
        slot = next(s for s in model.slots.slots if list(s.tokens[:len(tokens)]) == tokens)
        return model.router.kv.extract(slot.seq_id, 0, len(tokens))

    return model.engine.run_exclusive(read)
