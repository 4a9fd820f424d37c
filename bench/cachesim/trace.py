"""A request trace for the cache simulator: what the cache sees of each request.

Built from manifest lines (harness/manifest.py: generated workloads, the workbench's exports,
recorded sessions): each request's prompt tokens (the server's, through a body tokenizer, or word
pieces of a template-free rendering), its output length, its cache session
(`<session_id>/<branch_id>`, the key the workbench's and the replay's hints use), the hint it ends
with (the replay's: `tool_wait` when the branch's next line continues with a tool result, else
`done`) and the line it waits for (the replay's ordering rules: harness/serving/ordering.py).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

from harness.manifest import ManifestLine
from harness.serving.ordering import predecessors
from harness.serving.runner import hint_states, hint_tools
from harness.workloads.api_shapes import to_chat
from harness.workloads.generators import words_of_body
from harness.workloads.ideal import IdealResult, ideal_computed

#: a body's prompt tokens: ids from a server, or any hashable pieces (mapped to ids here)
BodyTokens = Callable[[dict], Sequence[Hashable]]

DEFAULT_OUTPUT_TOKENS = 32


@dataclass(frozen=True)
class TraceRequest:
    index: int  # position in the manifest
    session: str  # the cache session of its hints
    tokens: tuple[int, ...]
    output_tokens: int
    hint: str  # the state its hint announces when it ends: tool_wait or done
    waits_for: int | None  # the line it starts after
    t: float  # when the manifest says it was sent (seconds)
    tool: str | None = None  # the tool its tool_wait waits on (the replay's hint: harness hint_tools)


@dataclass
class Trace:
    requests: list[TraceRequest]
    unit: str  # "tokens" (the server's) or "words"
    source: str = ""
    _ideal: IdealResult | None = field(default=None, repr=False)

    @property
    def ideal(self) -> IdealResult:
        """The workload's ideal in manifest order (harness/workloads/ideal.py)."""
        if self._ideal is None:
            self._ideal = ideal_computed((r.tokens for r in self.requests), unit=self.unit)
        return self._ideal

    @property
    def sessions(self) -> int:
        return len({r.session for r in self.requests})

    def describe(self) -> dict:
        return {"source": self.source, "requests": len(self.requests), "sessions": self.sessions, "unit": self.unit,
                "prompt_tokens": self.ideal.total_prompt_tokens, "ideal": self.ideal.ideal_computed_tokens}


def trace_from_lines(lines: Sequence[ManifestLine], tokenize: BodyTokens | None = None, unit: str | None = None,
                     source: str = "") -> Trace:
    """The trace of `lines`; `tokenize` a body's prompt (default: word pieces, unit "words")."""
    tokenizer = tokenize or words_of_body
    vocab: dict[Hashable, int] = {}

    def ids(pieces: Sequence[Hashable]) -> tuple[int, ...]:
        if all(isinstance(p, int) for p in pieces):
            return tuple(int(p) for p in pieces)  # type: ignore[call-overload]
        return tuple(vocab.setdefault(p, len(vocab)) for p in pieces)

    waits = predecessors(lines)
    hints, tools = hint_states(lines), hint_tools(lines)
    requests = [
        TraceRequest(index=i, session=line.cache_session, tokens=ids(tokenizer(to_chat(line.api, line.body))),
                     output_tokens=line.expected_output_tokens or DEFAULT_OUTPUT_TOKENS, hint=hints[i],
                     waits_for=waits[i], t=line.t, tool=tools[i] if hints[i] == "tool_wait" else None)
        for i, line in enumerate(lines)
    ]
    return Trace(requests, unit or ("words" if tokenize is None else "tokens"), source)
