"""Randomized operations on the host checkpoint store, with its disk files and restarts, against
a reference: issue 32's "no checkpoint ever restored on a path it was not taken on".

Every checkpoint's blob names the exact token prefix it was taken after, so whatever `best`
returns can be checked against the prompt it was asked for. With a budget that never evicts,
`best` must also return the deepest checkpoint kept for a prefix of the prompt at or below the
limit (the reference: every prefix put so far); with a small budget, the bytes held stay
within it and every answer is still one taken on the prompt's own path. A restart (a new store
over the same checkpoint directory) keeps both properties through the disk files."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from server.cache.checkpoint_files import CheckpointFiles
from server.cache.checkpoint_store import CheckpointStore
from server.cache.checkpoints import StateCheckpoint

TOKENS = st.lists(st.integers(min_value=0, max_value=2), min_size=1, max_size=8)  # few tokens: shared prefixes


def blob_of(prefix: tuple[int, ...]) -> bytes:
    return ("state after " + ",".join(map(str, prefix))).encode()


class CheckpointStoreMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="arbor-ckpt-stateful-"))
        self.budget = None
        self.kept: set[tuple[int, ...]] = set()  # every prefix a checkpoint was put for
        self.store: CheckpointStore | None = None

    def _open(self) -> CheckpointStore:
        assert self.budget is not None
        return CheckpointStore(self.budget, CheckpointFiles(self.dir, "fp", 1 << 20))

    @initialize(small=st.booleans())
    def start(self, small):
        self.budget = 60 if small else 1 << 20
        self.store = self._open()

    @rule(path=TOKENS, data=st.data())
    def put(self, path, data):
        assert self.store is not None
        pos = data.draw(st.integers(min_value=1, max_value=len(path)))
        prefix = tuple(path[:pos])
        assert self.store.put(path, StateCheckpoint(pos, blob_of(prefix)))
        self.kept.add(prefix)

    @rule(prompt=TOKENS, data=st.data())
    def best(self, prompt, data):
        assert self.store is not None
        limit = data.draw(st.integers(min_value=0, max_value=len(prompt)))
        found = self.store.best(prompt, limit)
        if found is not None:
            assert found.pos <= limit and found.blob == blob_of(tuple(prompt[:found.pos])), (found, prompt)
        if self.budget == 1 << 20:  # nothing evicted: the deepest one kept must be found
            deepest = max((p for p in range(1, limit + 1) if tuple(prompt[:p]) in self.kept), default=None)
            assert (found.pos if found is not None else None) == deepest, (prompt, limit, found)

    @rule()
    def restart(self):
        assert self.store is not None
        self.store.close()  # writes what is queued for disk
        self.store = self._open()

    @invariant()
    def within_budget(self):
        if self.store is not None:
            assert self.store.bytes <= self.store.budget_bytes

    def teardown(self):
        if self.store is not None:
            self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)


CheckpointStoreMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TestCheckpointStoreAgainstReference = CheckpointStoreMachine.TestCase
