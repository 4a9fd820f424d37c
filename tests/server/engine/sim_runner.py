"""A simulated model backend for engine unit tests: deterministic tokens, no llama.cpp."""

from __future__ import annotations

from server.engine.kv_full import KVCacheFull
from server.engine.scheduler import Admission, StepItem
from server.engine.sequence import CacheReport, Sequence
from server.engine.slots import SlotPool

EOG = 2


class SimRunner:
    """Token ids map to pieces "<id>"; the next token is a pure function of the last one,
    or comes from `script` (a list of tokens per request, consumed in order).

    With `kv_capacity`, it simulates the unified KV pool: each slot's sequence holds its
    positions [0, n) (no sharing), and a batch that needs more cells than are free raises
    KVCacheFull without computing anything, as llama_decode does."""

    def __init__(self, script: dict[int, list[int]] | None = None, reuse: bool = True,
                 kv_capacity: int | None = None):
        self.script = script or {}
        self.reuse = reuse
        self.kv_capacity = kv_capacity
        self.held: dict[int, int] = {}  # slot sequence id -> cells it holds
        self.steps: list[list[tuple[int, int, int, bool]]] = []  # (seq id, n tokens, start pos, sample)
        self.released: list[tuple[int, str]] = []
        self.reclaimed: list[int] = []  # slot sequence ids whose kept KV was dropped

    def prepare(self, adm: Admission) -> None:
        n = min(adm.common_prefix, len(adm.seq.prompt) - 1) if self.reuse else 0
        adm.seq.n_past = adm.seq.n_cached = n
        adm.seq.cache_report = CacheReport("A" if n else "none", n)
        self.held[adm.slot.seq_id] = n

    def forward(self, items: list[StepItem]) -> list[list[int] | None]:
        if self.kv_capacity is not None:
            grown = {i.seq.slot.seq_id: i.start_pos + len(i.tokens) for i in items}
            after = {**self.held, **{k: max(v, self.held.get(k, 0)) for k, v in grown.items()}}
            if sum(after.values()) > self.kv_capacity:
                raise KVCacheFull(sum(len(i.tokens) for i in items))
            self.held = after
        self.steps.append([(i.seq.id, len(i.tokens), i.start_pos, i.sample) for i in items])
        out: list[list[int] | None] = []
        for item in items:
            if not item.sample:
                out.append(None)
                continue
            queue = self.script.get(item.seq.id)
            out.append([queue.pop(0) if queue else 100 + (item.tokens[-1] + 1) % 50])
        return out

    def release(self, seq: Sequence, reason: str) -> None:
        self.released.append((seq.id, reason))

    def background(self, idle: bool) -> None:
        pass

    def idle_work(self) -> float | None:
        return None

    def advance_loads(self) -> None:
        pass

    def loads_ready(self) -> bool:
        return False

    def reclaim(self, slots: SlotPool) -> bool:
        def forget(slot):
            self.held.pop(slot.seq_id, None)
            self.reclaimed.append(slot.seq_id)

        return slots.drop_oldest_idle(forget)

    def piece(self, token: int) -> bytes:
        return f"<{token}>".encode()

    def is_eog(self, token: int) -> bool:
        return token == EOG
