"""The FastAPI application of arbor-server.

The model loads in a background thread after the server starts listening, so /health can
answer 503 ("Loading model") meanwhile, as llama-server does.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI

from server import bootstrap
from server.api.engine_bridge.chat_layer import ChatTemplates
from server.api.engine_bridge.loop_delivery import LoopDelivery
from server.api.http import otel
from server.api.http.aliases import UnprefixedAliases
from server.api.http.cors import install_cors
from server.api.http.errors import install_error_handlers
from server.api.http.host_check import HostCheck
from server.api.http.request_guard import RequestGuard
from server.api.http.state import ServerState
from server.api.http.vllm_metrics import VllmAliases
from server.api.protocols.anthropic_messages.errors import AnthropicErrors
from server.api.routes import (
    anthropic_messages,
    cache,
    embeddings,
    info,
    native_completion,
    openai_chat,
    openai_completions,
    openai_responses,
    tokens,
)
from server.settings import ServerSettings

log = logging.getLogger(__name__)


def create_app(settings: ServerSettings) -> FastAPI:
    state = ServerState(settings=settings, model_name=bootstrap.default_model_name(settings))
    state.metrics.registry.register(VllmAliases(state))  # for routers that read vLLM's names

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        deliver = LoopDelivery(asyncio.get_running_loop(), settings.stream_interval_ms / 1000)

        kv_events = None

        async def load():
            nonlocal kv_events
            try:
                loaded = await asyncio.to_thread(bootstrap.load, settings, deliver)
                try:  # a template or a KV-event publisher that cannot start fails the load, loudly
                    loaded.template = ChatTemplates(loaded.runtime.model, template_override=loaded.template_source)
                    kv_events = _start_kv_events(settings, loaded)
                except Exception:
                    await asyncio.to_thread(loaded.close)
                    raise
                state.loaded = loaded
                state.metrics.add_live_gauges(lambda: _live_gauges(state))
            except Exception as exc:  # noqa: BLE001 - reported by /health and every route
                log.error("model failed to load: %s", exc)
                state.load_error = str(exc)

        task = asyncio.create_task(load())
        try:
            yield
        finally:
            await task
            if kv_events is not None:
                kv_events.close()
            if state.loaded is not None:
                await asyncio.to_thread(state.loaded.close)
            deliver.close()

    app = FastAPI(title="arbor-server", version="0.1.0", lifespan=lifespan)
    app.state.arbor = state
    install_error_handlers(app)
    otel.install(app)  # a span per generation request over OTLP, only with OTEL_EXPORTER_OTLP_ENDPOINT
    app.add_middleware(RequestGuard, settings=settings)
    app.add_middleware(AnthropicErrors)  # around the guard: its refusals on /v1/messages in Anthropic's format
    app.include_router(info.public)
    app.include_router(info.router)
    app.include_router(openai_chat.router)
    app.include_router(openai_responses.router)
    app.include_router(anthropic_messages.router)
    app.include_router(openai_completions.router)
    app.include_router(native_completion.router)
    app.include_router(embeddings.router)
    app.include_router(tokens.router)
    app.include_router(cache.router)
    app.add_middleware(UnprefixedAliases)
    install_cors(app, settings.cors_origins)
    app.add_middleware(HostCheck, settings=settings)  # added last: outermost, before CORS answers anything
    return app


def _start_kv_events(settings: ServerSettings, loaded):
    """The KV-event publisher when --kv-events-endpoint asks for one (its ZMQ and msgpack
    libraries come with the `scale` extra, so they are imported only then)."""
    if settings.kv_events_endpoint is None:
        return None
    try:
        from server.cache.kv_events import start_kv_events
    except ImportError as exc:
        raise RuntimeError(f"--kv-events-endpoint needs pyzmq and msgspec (pip install 'arbor[scale]'): {exc}") from exc
    return start_kv_events(settings, loaded.router.tree if loaded.router else None)


def _live_gauges(state: ServerState) -> dict[str, tuple[str, float]]:
    loaded = state.loaded
    if loaded is None:
        return {}
    stats = loaded.engine.stats()
    return {
        "llamacpp:requests_processing": ("Number of requests processing.", stats.n_running),
        "llamacpp:requests_deferred": ("Number of requests deferred.", stats.n_waiting),
        "llamacpp:n_decode_total": ("Total number of llama_decode() calls.", stats.n_decode_calls),
        "arbor:slots_busy": ("Slots running a request.", loaded.slots.n_busy()),
        "arbor:kv_cells_reserved": ("KV cells reserved by running requests.", loaded.engine.scheduler.reserved_cells),
        "arbor:kv_full_total": ("Decodes that found the KV pool full and freed cells first.", stats.n_kv_full),
        "arbor:requests_preempted_total": ("Requests stopped because the KV pool stayed full.", stats.n_preempted),
        "arbor:kv_cells_defragmented_total": ("KV cells moved out of pages shared with another sequence's cells "
                                              "(paged attention's defragmentation).",
                                              loaded.runtime.n_cells_defragmented),
        **_cache_gauges(loaded),
    }


def _cache_gauges(loaded) -> dict[str, tuple[str, float]]:
    """Per-tier cache figures, from `CacheRouter.stats()`: counters read without any lock the
    engine holds, so a scrape never waits for a store or a restore."""
    r = loaded.router
    if r is None:
        return {}
    st = r.stats()
    out: dict[str, tuple[str, float]] = {
        "arbor:cache_fallbacks": ("Restores that failed and fell back to computing.", st["fallbacks"]),
        "arbor:cache_deferrals": ("Requests deferred (at least once) to share an in-flight prefix.", st["deferrals"]),
        "arbor:cache_sessions": ("Sessions whose lifecycle hints the cache remembers (bounded by --cache-sessions).",
                                 st["lifecycle"]["sessions"]),
        "arbor:cache_sessions_aged_out_total": ("Sessions forgotten: idle, finished long ago, or past the bound.",
                                                st["lifecycle"]["aged_out"]),
        "arbor:cache_pinned_sessions": ("Sessions pinned now (bounded by --cache-max-pinned-sessions).",
                                        st["lifecycle"]["pinned"]),
        "arbor:cache_pinned_bytes": ("Host and disk KV bytes pinned sessions hold (--cache-max-pinned-mb).",
                                     st["lifecycle"]["pinned_bytes"]),
        "arbor:cache_pins_released_total": ("Pins released by the pin quotas (oldest first) to make room for newer "
                                            "ones.",
                                            st["lifecycle"]["pins_released"]),
    }
    if st["tree"] is not None:
        out["arbor:cache_tree_nodes"] = ("Nodes of the radix tree that indexes S owners, H and D.", st["tree"]["nodes"])
    tiers = st["tiers"]
    for tier, name in (("H", "host"), ("D", "disk")):
        if tiers[tier].get("enabled", True):
            for key in ("entries", "files", "tokens", "bytes", "held_bytes", "hits", "evictions", "declined",
                        "pending_bytes", "dropped_writes", "declined_low_space", "no_space_errors"):
                if key in tiers[tier]:
                    out[f"arbor:cache_{name}_{key}"] = (f"{name} tier {key}.", tiers[tier][key])
    if tiers["D"].get("enabled", True):
        out["arbor:cache_disk_corrupt_total"] = (
            "Disk segment files found torn, truncated or failing a checksum (skipped at start or at restore, "
            "never loaded).", tiers["D"]["corrupt_files"])
        out["arbor:cache_disk_foreign_total"] = (
            "Disk segment files of another model, KV layout or format version (skipped, never loaded).",
            tiers["D"]["foreign_files"])
    if tiers["R"].get("enabled", True):
        out["arbor:cache_shared_errors_total"] = (
            "Shared KV store calls that failed (lookup, read, write): each one computed instead.",
            tiers["R"]["errors"])
        for key in ("hits", "lookups", "stored_chunks", "rejected", "dropped_writes", "pending_bytes"):
            out[f"arbor:cache_shared_{key}"] = (f"shared tier {key}.", tiers["R"][key])
        out["arbor:cache_shared_unauthenticated_total"] = (
            "Shared-store values whose MAC did not verify (planted or damaged): refused, deleted, never loaded.",
            tiers["R"]["unauthenticated"])
        out["arbor:cache_shared_oversized_total"] = (
            "Shared-store values over --cache-shared-max-value-mb: refused from their length, never read.",
            tiers["R"]["oversized"])
    if tiers["S"].get("enabled", True):
        for key in ("entries", "cells", "charged_cells", "hits", "evictions"):
            out[f"arbor:cache_resident_{key}"] = (f"resident tier {key}.", tiers["S"][key])
    return out
