"""Sampling settings of one request, as plain data (the chain is built in sampling.py)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SamplingParams:
    """Validated sampling settings of one request (the API validates ranges)."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int | None = None
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    grammar: str | None = None  # GBNF, root rule "root"

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0
