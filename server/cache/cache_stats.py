"""What the cache reports (/cache/stats, /metrics): one dict from the parts of a
server.cache.router.CacheRouter (typed loosely: the router imports this module)."""

from __future__ import annotations

from typing import Any

from server.cache.tiers import STORED, Source, tier_of

OFF = {"enabled": False}


def cache_stats(router: Any) -> dict:
    """Everything the cache reports (/cache/stats, /metrics), from counters read without
    any lock the engine thread holds: a scrape never waits for a store or a restore."""
    tree, p, r, w = router.tree, router.planner, router.restorer, router.write
    stored = {source: tier_of(router.tiers, source) for source in STORED}
    return {
        "route": router.route,
        "costs": router.costs.stats(),
        "plans": {"by_plan": dict(p.by_plan), "shorter_than_longest": p.shorter_than_longest,
                  "recent": list(p.recent_plans)},
        "requests_by_source": dict(r.by_source),
        "reused_tokens_by_source": dict(r.reused_tokens),
        "fallbacks": r.fallbacks,
        "restores_in_pieces": {"restores": r.piecewise_restores, "pieces": r.pieces, "step_bytes": r.step_bytes},
        # restores written beside the compute (issue 58 item 4): the engine thread's longest part, and how often a
        # call on the KV waited for a write still running
        "restores_staged": {"enabled": r.staging, "restores": r.staged_restores,
                            "max_stage_ms": round(r.max_stage_ms, 3), "writes_waited": r.runtime.writes_waited},
        "deferrals": router.deferrals,
        "tiers": {
            Source.A: {"enabled": Source.A in router.enabled, "slots": len(router.slots.slots),
                       "idle_tokens_kept": sum(len(x.tokens) for x in tuple(router.slots.slots) if not x.busy),
                       "idle_cells_limit": w.idle_cells, "idle_offloads": w.idle_offloads,
                       **({"state": router.states.stats()} if router.states is not None else {})},
            Source.S: router.resident.stats() if router.resident else dict(OFF),
            **{source: tier.stats() if tier else dict(OFF) for source, tier in stored.items()},
        },
        # the shared tree's size: nodes, tokens on them, and tokens some owner holds
        "tree": None if tree is None else {"nodes": tree.n_nodes, "tokens": tree.n_tokens,
                                           "held_tokens": tree.held_tokens},
        "parked_cells": router.parked.cells() if router.parked else 0,
        "write_back": router.parked.stats() if router.parked else {"enabled": False},
        "write_back_gate": w.gate.stats(),
        "lifecycle": router.registry.summary(),
        "policy": router.events.stats() if router.events is not None else None,  # --cache-policy (issue 58)
        "prefetch": router.prefetch.stats() if router.prefetch is not None
        else {"enabled": False, "why": router.prefetch_off},  # --cache-prefetch (issue 58)
        "engine_thread": {"cache_ms": round(router.clock.cache_ms, 3), "write_backs": w.write_backs,
                          "write_backs_skipped": w.write_backs_skipped,
                          "write_back_ms": round(w.write_back_ms, 3),
                          "max_step_cache_ms": round(router.clock.max_step_ms, 3),
                          "max_step_cache_ms_by_kind": {k: round(v, 3)
                                                        for k, v in router.clock.max_step_ms_by_kind.items()}},
    }
