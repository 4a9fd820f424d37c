"""GET /health, /v1/models, /props, /slots, /metrics."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from server.api.deps import ModelDep, StateDep, require_api_key
from server.api.errors import APIError

public = APIRouter()
router = APIRouter(dependencies=[Depends(require_api_key)])


@public.get("/health")
async def health(state: StateDep):
    if state.loaded is not None:
        return {"status": "ok"}
    if state.load_error:
        return JSONResponse(APIError(f"model failed to load: {state.load_error}", status=500,
                                     type="server_error").body(), status_code=500)
    return JSONResponse(APIError("Loading model", status=503, type="unavailable_error").body(), status_code=503)


@router.get("/v1/models")
async def models(state: StateDep):
    info = state.loaded.runtime.info if state.loaded else None
    entry = {"id": state.model_name, "object": "model", "created": int(state.started_at), "owned_by": "arbor"}
    if info is not None:
        entry["meta"] = {"n_params": info.n_params, "size": info.size_bytes, "n_ctx_train": info.n_ctx_train,
                         "n_vocab": info.n_vocab, "architecture": info.architecture}
    return {"object": "list", "data": [entry]}


@router.get("/props")
async def props(state: StateDep, model: ModelDep):
    s, info = state.settings, model.runtime.info
    return {
        "model_alias": model.model_name,
        "model_path": info.path,
        "total_slots": s.parallel,
        "n_ctx": model.runtime.n_ctx,
        "n_ctx_slot": s.slot_ctx,
        "chat_template": model.template.source,
        "bos_token": info.bos_token,
        "eos_token": info.eos_token,
        "build_info": "arbor-server over llama.cpp (llama-cpp-python)",
        "default_generation_settings": {"n_ctx": s.slot_ctx, "params": {"temperature": 0.8, "top_k": 40,
                                                                         "top_p": 0.95, "min_p": 0.05}},
        "arbor": {
            "batch_size": model.runtime.n_batch,
            "kv_unified": True,
            "cache_tiers": [t for t in s.cache_tiers if s.tier_enabled(t)],
            "cache_note": model.cache_note,
            "architecture": info.architecture,
        },
    }


@router.get("/slots")
async def slots(model: ModelDep):
    """One entry per slot: `n_past` is what the engine believes its KV holds, `kv_pos_max`
    what llama.cpp's memory says (read on the engine thread, between steps)."""

    def read():
        return [
            {
                "id": s.index,
                "seq_id": s.seq_id,
                "is_processing": s.busy,
                "n_past": len(s.tokens) if not s.busy else None,
                "kv_pos_max": model.runtime.seq_pos_max(s.seq_id),
                "n_requests": s.n_requests,
            }
            for s in model.slots.slots
        ]

    return await asyncio.to_thread(model.engine.run_exclusive, read)


@router.get("/metrics")
async def metrics(state: StateDep):
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
