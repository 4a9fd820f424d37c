"""The engine thread's time spent in the cache (routing, restores, write-back, prefetch), which
other streams wait for: the total, and the longest stretch between two decodes (one admission, one
step's restore pieces, one step's write-back pieces, one step's prefetch pieces), overall and by
kind. Shown in /cache/stats `engine_thread`."""

from __future__ import annotations

from dataclasses import dataclass, field

KINDS = ("admission", "restore", "write_back", "prefetch")


@dataclass
class EngineTime:
    cache_ms: float = 0.0
    max_step_ms: float = 0.0
    max_step_ms_by_kind: dict[str, float] = field(default_factory=lambda: dict.fromkeys(KINDS, 0.0))

    def add(self, ms: float, *, step: bool = True, kind: str = "admission") -> None:
        """`ms` of cache work on the engine thread; `step`: it ran between two decodes; `kind`: one of KINDS."""
        self.cache_ms += ms
        if step:
            self.max_step_ms = max(self.max_step_ms, ms)
            self.max_step_ms_by_kind[kind] = max(self.max_step_ms_by_kind[kind], ms)
