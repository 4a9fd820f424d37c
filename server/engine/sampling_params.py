"""Sampling settings of one request, as plain data (the chain is built in sampling.py)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Constraint:
    """A GBNF grammar on the reply (root rule "root"), as llama.cpp's samplers take it.

    `lazy`: the grammar only applies from the point where the text matches one of
    `trigger_patterns` (regexes) or a `trigger_tokens` token comes out (a family's tool-call
    opener), as llama-server's tool-call grammars do. `prefill`: tokens fed to the grammar before
    the reply (the generation prompt a chat grammar starts with, e.g. an opened <think>)."""

    grammar: str | None = None
    lazy: bool = False
    trigger_patterns: tuple[str, ...] = ()
    trigger_tokens: tuple[int, ...] = ()
    prefill: tuple[int, ...] = ()


@dataclass(frozen=True)
class ReasoningBudget:
    """Where a thinking model's reasoning is and how long it may be (llama-server's reasoning
    budget): the template's tags, the budget in tokens (-1: unlimited; the sampler then only
    tracks the reasoning, so a lazy grammar's trigger inside it does not fire), the message
    forced before the end tag when the budget runs out, and the generation prompt's tokens
    (which may already open the reasoning)."""

    start_tag: str
    end_tags: tuple[str, ...]
    budget: int = -1
    message: str = ""
    prefill: tuple[int, ...] = ()


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
    constraint: Constraint = field(default_factory=Constraint)
    reasoning: ReasoningBudget | None = None

    @property
    def grammar(self) -> str | None:
        return self.constraint.grammar

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0
