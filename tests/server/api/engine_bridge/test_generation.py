"""One engine request read from the event loop (no model)."""

from __future__ import annotations

from server.api.engine_bridge.generation import coalesce
from server.engine.sequence import CacheReport, Finished, TextDelta

FIN = Finished("stop", 3, 0, 2, 1.0, 1.0, CacheReport())


def test_coalesce_joins_runs_of_text_only():
    events = [TextDelta("a", (1,)), TextDelta("b", (2,)), FIN, TextDelta("c", (3,))]
    assert coalesce(events) == [TextDelta("ab", (1, 2)), FIN, TextDelta("c", (3,))]
    assert coalesce([]) == []
