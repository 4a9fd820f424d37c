"""A simulated model backend for engine unit tests: deterministic tokens, no llama.cpp."""

from __future__ import annotations

from server.engine.scheduler import Admission, StepItem
from server.engine.sequence import CacheReport, Sequence

EOG = 2


class SimRunner:
    """Token ids map to pieces "<id>"; the next token is a pure function of the last one,
    or comes from `script` (a list of tokens per request, consumed in order)."""

    def __init__(self, script: dict[int, list[int]] | None = None, reuse: bool = True):
        self.script = script or {}
        self.reuse = reuse
        self.steps: list[list[tuple[int, int, int, bool]]] = []  # (seq id, n tokens, start pos, sample)
        self.released: list[tuple[int, str]] = []

    def prepare(self, adm: Admission) -> None:
        n = min(adm.common_prefix, len(adm.seq.prompt) - 1) if self.reuse else 0
        adm.seq.n_past = adm.seq.n_cached = n
        adm.seq.cache_report = CacheReport("A" if n else "none", n)

    def forward(self, items: list[StepItem]) -> list[int | None]:
        self.steps.append([(i.seq.id, len(i.tokens), i.start_pos, i.sample) for i in items])
        out: list[int | None] = []
        for item in items:
            if not item.sample:
                out.append(None)
                continue
            queue = self.script.get(item.seq.id)
            out.append(queue.pop(0) if queue else 100 + (item.tokens[-1] + 1) % 50)
        return out

    def release(self, seq: Sequence, reason: str) -> None:
        self.released.append((seq.id, reason))

    def piece(self, token: int) -> bytes:
        return f"<{token}>".encode()

    def is_eog(self, token: int) -> bool:
        return token == EOG
