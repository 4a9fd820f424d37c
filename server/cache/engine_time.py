"""The engine thread's time spent in the cache (routing, restores, write-back), which other
streams wait for: the total, and the longest stretch between two decodes (one admission, one
finished read's restore, or one step's write-back pieces). Shown in /cache/stats."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineTime:
    cache_ms: float = 0.0
    max_step_ms: float = 0.0

    def add(self, ms: float, *, step: bool = True) -> None:
        """`ms` of cache work on the engine thread; `step`: it ran between two decodes."""
        self.cache_ms += ms
        if step:
            self.max_step_ms = max(self.max_step_ms, ms)
