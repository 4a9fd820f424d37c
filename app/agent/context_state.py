"""What a branch's thread remembers about fitting its context: the compaction level and, for
servers that cannot count tokens, the branch's own characters-per-token estimate.

Both live in the graph state (`AgentState.context`, a plain dict so that every checkpointer
stores it), so they belong to the branch: a fork copies them with the checkpoint it starts
from (its parent's level and estimate at the fork point), a retry starts from the last good
checkpoint's, and no session or branch shares them with another. The reducer `advance` keeps
the level moving forward only, whatever a node writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.agent.compaction import Level


@dataclass(frozen=True)
class ContextState:
    level: Level = Level()
    # "tools" / "plain" -> characters per token learned from the server's counts of this
    # branch's requests (app/agent/token_estimate.py); empty until a call was answered
    chars_per_token: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, value: dict | None) -> ContextState:
        value = value or {}
        return cls(Level(int(value.get("reduced", 0)), int(value.get("dropped", 0))),
                   dict(value.get("chars_per_token") or {}))

    def as_state(self) -> dict:
        return {"reduced": self.level.reduced, "dropped": self.level.dropped,
                "chars_per_token": dict(self.chars_per_token)}


def advance(left: dict | None, right: dict | None) -> dict:
    """Reducer of `AgentState.context`: the level only moves forward, the newest estimate wins."""
    if right is None:
        return left or ContextState().as_state()
    old, new = ContextState.of(left), ContextState.of(right)
    return ContextState(old.level.forward(new.level), new.chars_per_token or old.chars_per_token).as_state()
