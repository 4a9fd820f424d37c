"""GET /cache/stats, POST /cache/flush: what each prefix source holds, and emptying them.
POST /cache/hint: a lifecycle hint without a generation (read by server/api/http/cache_fields.py,
recorded by server/cache/lifecycle.py)."""

from __future__ import annotations

import asyncio
import json

from fastapi import APIRouter, Depends, Request

from server.api.http.cache_fields import CacheHintError, parse_cache_hint
from server.api.http.deps import ModelDep, require_api_key
from server.api.http.errors import invalid
from server.cache.checkpointed_slots import CheckpointedSlotReuse
from server.cache.kv_ops import used_cells

router = APIRouter(dependencies=[Depends(require_api_key)])


def _stats(model, measure: bool) -> dict:
    r, s = model.router, model.slots
    if r is not None:
        out = r.stats()
    else:
        off = {"enabled": False}
        out = {"route": "slot reuse only", "costs": None, "plans": None, "requests_by_source": None,
               "reused_tokens_by_source": None, "fallbacks": 0, "deferrals": 0,
               "tiers": {"A": {"enabled": True, "slots": len(s.slots),
                               "idle_tokens_kept": sum(len(x.tokens) for x in s.slots if not x.busy),
                               "idle_cells_limit": None, "idle_offloads": 0}, "S": off, "H": off, "D": off, "R": off},
               "tree": None, "parked_cells": 0, "write_back": off, "lifecycle": None,
               "engine_thread": {"cache_ms": 0.0, "write_backs": 0, "write_backs_skipped": 0, "write_back_ms": 0.0,
                                 "max_step_cache_ms": 0.0}}
    if isinstance(model.prefix, CheckpointedSlotReuse):  # tier A on a model with SWA or recurrent layers
        out["tiers"]["A"]["state"] = model.prefix.stats()
    out["note"] = model.cache_note
    rt = model.runtime
    out["kv"] = {"n_ctx": rt.n_ctx, "scratch_in_use": model.seq_ids.in_use("scratch"),
                 "parked_cells": out.pop("parked_cells"),
                 # the KV layout (--kv-layout): split has a stream of stream_cells per sequence id; copies between
                 # streams that a state read or write had llama.cpp make before the next decode
                 "layout": rt.kv_layout, "streams": rt.n_stream, "stream_cells": rt.n_ctx_seq if rt.split else None,
                 "copies_made_early": rt.copies_made_early}
    engine = model.engine.stats()
    out["engine_thread"]["decode_ms"] = round(engine.busy_seconds * 1000.0, 3)
    out["engine_thread"]["decode_calls"] = engine.n_decode_calls  # decode_ms / decode_calls: a step's mean
    if measure:
        from server.cache.resident import union_positions

        running = {q.slot.index: q.kv_tokens() for q in model.engine.scheduler.running if q.slot is not None}
        held = [running.get(x.index, list(x.tokens) if not x.busy else []) for x in s.slots]
        held += [o.tokens for o in r.resident.owners] if r and r.resident else []
        out["kv"]["used_cells"] = used_cells(model.runtime)
        # unified: the held prefixes share cells (their union); split: each stream holds its own copy
        out["kv"]["union_bound"] = (sum(len(h) for h in held) if rt.split else
                                    union_positions([h for h in held if h]))
    return out


@router.get("/cache/stats")
async def cache_stats(model: ModelDep, measure: bool = False):
    """`measure=true` also counts the KV cells really in use (a full state read: slow)."""
    return await asyncio.to_thread(model.engine.run_exclusive, lambda: _stats(model, measure))


@router.post("/cache/flush")
async def cache_flush(model: ModelDep):
    """Empty tiers S, H and D (slots keep their own KV until their next request)."""
    if model.router is None:
        return {"flushed": {}}
    freed = await asyncio.to_thread(model.engine.run_exclusive, model.router.flush)
    return {"flushed": freed}


@router.post("/cache/hint")
async def cache_hint(request: Request, model: ModelDep):
    """A lifecycle hint that no request carries: the body is what a request's ``"cache"``
    holds (``{"session", "state", "pin"}``), or the X-Arbor-* headers. Answers what the
    server now holds for the session; ``recorded`` is false when the cache is off."""
    raw = await request.body()
    try:
        body = json.loads(raw) if raw.strip() else None
    except ValueError:
        raise invalid("the body must be a JSON object like a request's \"cache\" field") from None
    if body is not None and not isinstance(body, dict):
        raise invalid(f"the body must be a JSON object, got {type(body).__name__}")
    try:
        hint = parse_cache_hint({"cache": body}, request.headers)
        if hint.session is None:
            raise CacheHintError("a hint needs a session (session in the body, or X-Arbor-Session)", "session")
    except CacheHintError as exc:
        raise invalid(str(exc), param=exc.param) from exc
    r = model.router
    if r is None:
        return {"session": hint.session, "recorded": False,
                "reason": model.cache_note or "the prefix cache is off (only slot reuse)"}
    status = r.registry.apply(hint)  # thread-safe and quick: no need to wait for an engine step
    return {**status.to_dict(), "recorded": status.known}
