"""GET /health, /version, /v1/models, /props, /slots, /metrics."""

from __future__ import annotations

import asyncio
from dataclasses import asdict

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from server.api.engine_bridge.prompting import templates
from server.api.http.deps import ModelDep, StateDep, require_api_key
from server.api.http.errors import APIError
from server.build_info import arbor_version, build_string
from server.engine.offload import OffloadReport
from server.engine.paged_attention import SelfCheck

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


@public.get("/version")
async def version():
    """vLLM's `/version`. Routers probe it to classify a worker whose `/v1/models` `owned_by`
    they do not know (SMG: model_gateway/src/workflow/steps/local/detect_backend.rs); a
    worker answering it is scraped for vLLM's metric names, which server/api/http/vllm_metrics.py
    provides. Unauthenticated, as vLLM's."""
    return {"version": arbor_version(), "build": build_string()}


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
    template = templates(model)
    return {
        "model_alias": model.model_name,
        "model_path": info.path,
        "total_slots": s.parallel,
        "n_ctx": model.runtime.n_ctx,
        "n_ctx_slot": model.max_request_tokens,
        "chat_template": template.source,
        "chat_template_caps": template.caps,
        "bos_token": info.bos_token,
        "eos_token": info.eos_token,
        "build_info": build_string(),
        "system_fingerprint": model.system_fingerprint,
        "default_generation_settings": {"n_ctx": model.max_request_tokens, "params": {"temperature": 0.8, "top_k": 40,
                                                                         "top_p": 0.95, "min_p": 0.05}},
        "arbor": {
            "batch_size": model.runtime.n_batch,
            "kv_unified": not model.runtime.split,
            "kv_layout": _kv_layout(model),
            # one request may use max_request_tokens; running requests reserve cells out of
            # kv_cells (the rest of n_ctx is room for resident prefixes)
            "max_request_tokens": model.max_request_tokens,
            "kv_cells": model.runtime.n_ctx_seq * s.parallel if model.runtime.split else s.ctx_size,
            "kv_cells_reserved": model.engine.scheduler.reserved_cells,
            "cache_tiers": [t for t in s.cache_tiers if s.tier_enabled(t)],
            "cache_note": model.cache_note,
            "architecture": info.architecture,
            # --stream-interval-ms: the longest a streamed token waits to share a chunk (0: a chunk per token)
            "stream_interval_ms": s.stream_interval_ms,
            "paged_attention": {
                "compiled_in": model.runtime.paged_attn.compiled_in,
                "enabled": model.runtime.paged_attn.enabled,
                "page_size": model.runtime.paged_attn.page_size,
                "placement": model.runtime.page_placement,  # --page-placement in force; null with paging off
                "note": model.runtime.paged_attn.note,
                # llama.cpp's check of every paged mask (LLAMA_PAGED_ATTN_SELF_CHECK=1; slow): null when paging is off
                "self_check": _self_check(model.runtime.paged_self_check()),
            },
            "speculative": _speculative(model),
            "devices": [asdict(d) for d in model.runtime.devices.devices],
            "offload": _offload(model.runtime.offload),
            # the Responses API's stored responses: limits (--responses-store, --responses-store-mb) and occupancy
            "responses_store": state.responses.stats(),
        },
    }


def _kv_layout(model: ModelDep) -> dict:
    """The KV layout in force (--kv-layout resolved): which, what was asked, why, its streams and what it changed."""
    runtime, choice = model.runtime, model.kv_layout
    return {
        "layout": choice.layout,
        "asked": choice.asked,
        "reason": choice.reason,
        "streams": runtime.n_stream,
        "stream_cells": runtime.n_ctx_seq if runtime.split else None,  # split: cells of each sequence's stream
        "notes": list(model.kv_layout_notes),
    }


def _speculative(model: ModelDep) -> dict:
    """The drafter in force (--spec-type resolved; `auto` names what it drafts with), its policy and what it
    drafted so far, or why it is off."""
    spec = model.speculator
    if spec is None:
        return {"enabled": False, "types": [], "note": model.speculative_note}
    return {
        "enabled": True,
        "types": list(spec.drafter.types),
        "policy": "adaptive" if spec.policy.adaptive else "always",
        "n_max": spec.drafter.n_max,
        "draft_model": str(spec.drafter.config.draft_model) if spec.drafter.config.draft_model else None,
        "drafts": spec.n_drafts,
        "draft_n": spec.n_drafted,
        "draft_n_accepted": spec.n_accepted,
        "note": None,
    }


def _self_check(status: SelfCheck | None) -> dict | None:
    return None if status is None else asdict(status)


def _offload(report: OffloadReport) -> dict:
    """Where the layers and matmuls run (server/engine/offload.py says what each field means)."""
    return {
        "n_gpu_layers": report.n_gpu_layers,
        "layers_offloaded": report.offloaded,
        "layers_total": report.offloadable,
        "offload_devices": list(report.devices),
        "backend": report.backend,
        "soc": report.soc,
        "cpu_fallback": report.cpu_fallback,
        "weight_types": report.weight_types,
        "cpu_weight_types": report.cpu_weight_types,
        "needed_weight_types": list(report.needed_types),
        "warnings": [m for m in (report.weights_warning(), *report.notes) if m],
    }


@router.get("/slots")
async def slots(model: ModelDep):
    """One entry per slot: `n_past` is what the engine believes its KV holds, `kv_pos_max`
    what llama.cpp's memory says (read on the engine thread, between steps)."""

    def read():
        running = {seq.slot.index: seq for seq in model.engine.scheduler.running if seq.slot is not None}
        out = []
        for s in model.slots.slots:
            seq = running.get(s.index)
            out.append({
                "id": s.index,
                "seq_id": s.seq_id,
                "n_ctx": model.max_request_tokens,
                "is_processing": s.busy,
                "n_past": seq.n_past if seq is not None else (None if s.busy else len(s.tokens)),
                "n_reserved": seq.reserved_cells if seq is not None else 0,
                "kv_pos_max": model.runtime.seq_pos_max(s.seq_id),
                "n_requests": s.n_requests,
            })
        return out

    return await asyncio.to_thread(model.engine.run_exclusive, read)


@router.get("/metrics")
async def metrics(state: StateDep):
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
