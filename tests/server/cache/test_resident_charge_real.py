"""The owners' budget on the real engine (server/cache/resident.py, unified KV): cells an owner shares with
a slot are not charged. One slot, two sessions in tool waits whose paths share nothing, a budget for one
path: the second takes the slot, both paths are published, and only the first one's cells are charged
(the slot holds the second's), so the first session's next call attaches its path (S). Charging every
held cell (as before), publishing the second evicted the first (no host tier here: its next call would
compute it again)."""

from __future__ import annotations

import pytest

from server.cache.lifecycle import CacheHint
from tests.server.cache.engine_harness import generate, kept_cells, reset_kv, used_cells
from tests.server.cache.test_router_real import load

pytestmark = pytest.mark.model


def test_a_tool_waits_path_stays_resident_while_the_slot_holds_another():
    model = load(None, parallel=1, cache_policy="lifecycle", cache_tiers=("A", "S"), resident_cells=200,
                 spec_type="none")
    try:
        def prompt(text: str) -> list[int]:
            return model.runtime.tokenize(text, add_special=False, parse_special=False)

        first = prompt("Alpha pump report. " + "The pump on line 3 vibrates at 9 mm/s after maintenance. " * 8)
        other = prompt("Zulu conveyor report. " + "The conveyor on line 7 stalls every day at noon. " * 8)
        assert first[0] != other[0] and max(len(first), len(other)) < 200 < len(first) + len(other), "the premise"
        generate(model, first, max_tokens=2, hint=CacheHint(session="s1", state="tool_wait"))
        generate(model, other, max_tokens=2, hint=CacheHint(session="s2", state="tool_wait"))
        s = model.router.stats()["tiers"]["S"]
        assert s["entries"] == 2 and s["cells"] > s["budget_cells"] >= s["charged_cells"] > 0, s
        back = first + prompt(" Tool result: sensor V-3 reads 9 mm/s.")
        got = generate(model, back, max_tokens=2, hint=CacheHint(session="s1", state="done"))
        assert got.final.cache.source == "S" and got.final.cached_tokens >= len(first), got.final
        s = model.router.stats()["tiers"]["S"]
        assert s["charged_cells"] <= s["budget_cells"], s
        reset_kv(model)
        assert used_cells(model) == kept_cells(model) == 0, "no cell left behind"
        assert model.seq_ids.in_use("owner") == 0
    finally:
        model.close()
