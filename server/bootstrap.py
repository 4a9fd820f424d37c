"""Composition root: settings -> llama.cpp runtime -> prefix provider -> engine.

This is the only module that knows how the pieces fit; routes receive the finished
`LoadedModel` through `server.api.http.state` (the API layer adds what only HTTP needs, such as
the chat template's renderer).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from server.build_info import system_fingerprint
from server.cache.checkpoint_files import CheckpointFiles
from server.cache.checkpoint_store import CheckpointStore
from server.cache.checkpointed_slots import CheckpointedSlotReuse, SlotStates
from server.cache.checkpoints import ModelMemory
from server.cache.disk_tier import DiskTier
from server.cache.fingerprint import model_fingerprint
from server.cache.host_tier import HostTier
from server.cache.kv_ops import KVOps
from server.cache.lifecycle import SessionRegistry
from server.cache.policy_choice import choose_policy
from server.cache.policy_events import PolicyEvents
from server.cache.predictive_policy import PredictivePolicy
from server.cache.radix_tree import RadixTree
from server.cache.router import CacheRouter
from server.cache.shared_tier import SharedTier
from server.cache.tiers import ON_TREE, KVTier, Source
from server.engine import kv_layout
from server.engine.embedder import Embedder, EmbeddingsUnavailable
from server.engine.engine import Deliver, Engine, deliver_inline
from server.engine.kv_layout import KVLayoutChoice
from server.engine.llama_runtime import LlamaRuntime, RuntimeConfig
from server.engine.model_info import ModelInfo
from server.engine.offload import OffloadReport
from server.engine.runner import LlamaRunner, PrefixProvider, SlotReuseOnly
from server.engine.scheduler import Scheduler
from server.engine.seq_ids import SequenceIdLayout, SequenceIdPool
from server.engine.slots import SlotPool
from server.engine.speculative.drafter import Drafter
from server.engine.speculative.policy import DraftPolicy
from server.engine.speculative.speculator import Speculator
from server.model_file import embedded_model_path
from server.settings import ServerSettings

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    runtime: LlamaRuntime
    engine: Engine
    template_source: str | None  # --chat-template-file's template (Jinja); None: the model's own
    slots: SlotPool
    seq_ids: SequenceIdPool
    prefix: PrefixProvider
    model_name: str
    cache_note: str | None  # why some cache tiers are off, when they are
    max_request_tokens: int  # prompt + completion of one request: --ctx-size or the model's training context
    router: CacheRouter | None = None
    system_fingerprint: str = ""  # build + model identity (server.build_info)
    embedder: Embedder | None = None
    embeddings_note: str | None = None  # why embedder is None
    speculator: Speculator | None = None  # speculative decoding (None: off)
    speculative_note: str | None = None  # why it is off, when --spec-type asked for it
    template: object | None = None  # the API layer's chat templates (server.api.engine_bridge.chat_layer.ChatTemplates)
    # the KV layout in force (--kv-layout resolved, with why) and what it turned off or sized, and why
    kv_layout: KVLayoutChoice = field(default_factory=lambda: KVLayoutChoice("unified", "unified", "the default"))
    kv_layout_notes: tuple[str, ...] = ()

    def close(self) -> None:
        self.engine.stop()
        if self.speculator is not None:
            self.speculator.close()
        if self.router is not None:
            self.router.close()
        if self.embedder is not None:
            self.embedder.close()
        self.runtime.close()


def model_path(settings: ServerSettings) -> Path:
    return settings.model or embedded_model_path()


def default_model_name(settings: ServerSettings) -> str:
    return settings.alias or model_path(settings).stem


# Resident owners: enough for a handful of common prefixes (system prompts, documents).
MAX_RESIDENT_OWNERS = 8
SCRATCH_SEQUENCES = 2


@dataclass(frozen=True)
class KVShape:
    """What the context is made with for a layout: its sequence ids, its cells, and what the layout changed."""

    layout: SequenceIdLayout
    n_ctx: int  # cells of the context (unified: one pool; split: a stream per sequence id)
    notes: tuple[str, ...] = ()


def kv_shape(settings: ServerSettings, choice: KVLayoutChoice) -> KVShape:
    """The sequence ids and cells of the context in the chosen layout. Unified: the slots' cells plus
    --resident-cells for resident owners, which share cells with the slots; scratch sequences for moving KV;
    parked sequences for piecewise write-back. Split: every sequence id is a stream of --ctx-size / --parallel
    cells, so only the slots and the owner streams --resident-cells pays for (at most MAX_RESIDENT_OWNERS); no
    scratch (KV is read and restored in the slot's own stream) and no parked copies (a slot is written back at
    once): each would cost a whole stream."""
    wants_cache = any(settings.tier_enabled(source) for source in ON_TREE)
    wants_s = settings.tier_enabled(Source.S)
    parks = settings.tier_enabled(Source.H) and bool(settings.cache_write_back_step)
    if not choice.split:
        layout = SequenceIdLayout(
            slots=settings.parallel,
            owners=MAX_RESIDENT_OWNERS if wants_s else 0,
            scratch=SCRATCH_SEQUENCES if wants_cache else 0,
            # a slot's kept KV waits under one of these while it is written back piece by piece
            parked=settings.parallel if parks else 0,
        )
        # resident owners may hold cells beyond what the slots use
        return KVShape(layout, settings.ctx_size + (settings.resident_cells if wants_s else 0))
    cells = kv_layout.stream_cells(settings.ctx_size, settings.parallel)
    owners = min(MAX_RESIDENT_OWNERS, settings.resident_cells // cells) if wants_s else 0
    notes = [f"{settings.parallel} slot streams of {cells} cells (--ctx-size {settings.ctx_size} / --parallel "
             f"{settings.parallel}, padded to {kv_layout.LLAMA_STREAM_PAD} as llama.cpp pads a stream)"]
    if wants_s:
        notes.append("tier S copies a prefix from the stream that holds it (another slot's or a resident owner's) "
                     "into the slot's: a whole stream per copy, made on the device")
        notes.append(f"{owners} resident-owner streams of {cells} cells (--resident-cells {settings.resident_cells})"
                     if owners else
                     f"no resident-owner stream: --resident-cells {settings.resident_cells} is less than one stream "
                     f"of {cells} cells; S copies from other slots only")
    if parks:
        notes.append("parked write-back is off: a parked copy would take a stream of its own; a slot's KV is written "
                     "back at once when the slot is taken (--cache-write-back-step applies to the unified layout)")
    if wants_cache:
        notes.append("no scratch sequences: KV is read from and restored into the slot's own stream (host, disk and "
                     "shared-store restores start at position 0)")
    layout = SequenceIdLayout(slots=settings.parallel, owners=owners, scratch=0, parked=0)
    return KVShape(layout, cells * layout.total, tuple(notes))


def unsupported_cache_reason(info) -> str | None:
    """Why tiers S/H/D cannot serve this model at all (slot reuse, with state checkpoints, still
    works: server/cache/checkpointed_slots.py), or None."""
    if info.is_recurrent and not info.is_hybrid:
        return (f"{ModelMemory.of(info).describe()} and no attention KV: tiers S/H/D store attention KV; slots (A) "
                "reuse their prefixes with state checkpoints (--ctx-checkpoints)")
    return None


def _build_router(settings: ServerSettings, runtime: LlamaRuntime, seq_ids: SequenceIdPool, slots: SlotPool,
                  running: Callable[[], list], path: Path, memory: ModelMemory, partial_state: bool) -> CacheRouter:
    """`partial_state`: the model has window or recurrent layers, whose state the stored tiers
    restore from checkpoints; `memory`: what its slots can cut back (server/cache/checkpoints.py)."""
    registry = SessionRegistry(max_sessions=settings.cache_sessions, idle_seconds=settings.cache_session_idle,
                               max_pinned=settings.cache_max_pinned_sessions,
                               max_pinned_bytes=settings.cache_max_pinned_mb * 1024 * 1024)
    policy = choose_policy(settings.cache_policy, registry, settings.predict_params, settings.cache_priors)
    enabled = {source for source in Source if settings.tier_enabled(source)}
    states = None
    tree = RadixTree() if enabled & set(ON_TREE) else None  # one tree indexes S owners, H and D
    tiers: list[KVTier] = []  # the stored tiers, fastest first (server.cache.tiers.STORED)
    if Source.H in enabled and tree is not None:
        tiers.append(HostTier(tree, settings.cache_ram * 1024 * 1024, policy))
    if Source.D in enabled or settings.cache_shared:
        info = runtime.info
        # D and R share one fingerprint: only replicas of the same model file, KV types and
        # layout ever read each other's KV (the shared store's keys start with it).
        fp = model_fingerprint(path, architecture=info.architecture, n_layer=info.n_layer, n_embd=info.n_embd,
                               kv_types=f"k={settings.cache_type_k},v={settings.cache_type_v},fa={settings.flash_attn}")
    if Source.D in enabled:
        assert tree is not None and settings.cache_dir is not None  # D: the settings require --cache-dir
        tiers.append(DiskTier(tree, settings.cache_dir, settings.cache_disk * 1024 * 1024, fp, policy,
                              queue_bytes=settings.cache_disk_queue * 1024 * 1024,
                              reserve_bytes=settings.cache_disk_reserve_mb * 1024 * 1024, streams=runtime.n_stream))
    if partial_state:  # window cells or a recurrent state: A, S (other slots), H and D with checkpoints
        files = (CheckpointFiles(settings.cache_dir / "checkpoints", fp, settings.cache_checkpoint_disk * 1024 * 1024,
                                 queue_bytes=settings.cache_disk_queue * 1024 * 1024)
                 if Source.D in enabled and settings.cache_dir is not None and settings.cache_checkpoint_disk else None)
        states = SlotStates(runtime, memory, per_slot=settings.ctx_checkpoints, every=settings.checkpoint_every,
                            store=CheckpointStore(settings.cache_checkpoint_ram * 1024 * 1024, files),
                            align=settings.cache_shared_chunk if settings.cache_shared and Source.H in enabled else 0)
    if settings.cache_shared and Source.H in enabled:  # written from the host tier
        assert settings.cache_shared_secret is not None  # the settings require it
        tiers.append(SharedTier(settings.cache_shared, fp, settings.cache_shared_chunk,
                                secret=settings.cache_shared_secret.get_secret_value(),  # the settings require it
                                lookup_timeout_s=settings.cache_shared_timeout_ms / 1000.0,
                                queue_bytes=settings.cache_shared_queue * 1024 * 1024,
                                max_value_bytes=settings.cache_shared_max_value_mb * 1024 * 1024,
                                checkpoints=states is not None))
    router = CacheRouter(
        runtime=runtime, kv=KVOps(runtime, seq_ids, partial_state=states is not None), slots=slots, running=running,
        enabled=enabled, tree=tree, tiers=tiers,
        resident_cells=settings.resident_cells if Source.S in enabled and seq_ids.layout.owners else None,
        registry=registry,
        min_tokens=settings.cache_min_tokens, route=settings.cache_route,
        write_back_step_bytes=settings.cache_write_back_step * 1024, idle_cells=settings.cache_idle_cells,
        restore_step_bytes=settings.cache_restore_step * 1024, restore_beside=settings.cache_restore_beside == "auto",
        write_back_beside=settings.cache_write_back_beside == "auto",
        states=states, split=runtime.split,
    )
    router.events = PolicyEvents(policy, registry, router.resident, router.write)  # --cache-policy: owners too
    if settings.cache_prefetch == "off":
        router.prefetch_off = "--cache-prefetch off"
    elif isinstance(policy, PredictivePolicy):
        why = router.enable_prefetch(policy, seq_ids, min_value=settings.cache_prefetch_min_value,
                                     min_tokens=settings.cache_min_tokens,
                                     step_bytes=settings.cache_prefetch_step * 1024)
        if why is not None:
            log.info("cache prefetch off: %s", why)
    return router


def load(settings: ServerSettings, deliver: Deliver = deliver_inline) -> LoadedModel:
    """Load the model and start the engine; `deliver` hands each step's events to their
    sinks (the HTTP server passes one that runs them on its event loop)."""
    path = model_path(settings)
    wants_cache = any(settings.tier_enabled(source) for source in ON_TREE)
    flash = {"auto": None, "on": True, "off": False}[settings.flash_attn]
    speculator: Speculator | None = None
    base = RuntimeConfig(
        model_path=path,
        n_ctx=settings.ctx_size,  # and n_seq_max, kv_unified: set by `shape` for the layout
        n_batch=settings.batch_size,
        n_seq_max=settings.parallel,
        n_threads=settings.threads,
        n_threads_batch=settings.batch_threads,
        n_gpu_layers=settings.n_gpu_layers,
        flash_attn=flash,
        cache_type_k=settings.cache_type_k,
        cache_type_v=settings.cache_type_v,
        paged_attn=settings.paged_attn,
        swa_full=settings.swa_full,
        page_size=settings.page_size,
        page_placement=settings.page_placement,
    )
    chosen: dict[str, object] = {}

    def shape(info: ModelInfo, report: OffloadReport) -> RuntimeConfig:
        """The KV layout, once the model and where its layers run are known (KVLayoutUnavailable refuses)."""
        structure = ModelMemory.of(info)
        choice = kv_layout.choose(settings.kv_layout, backend=report.backend if report.offloaded else None,
                                  parallel=settings.parallel, paged_attn=settings.paged_attn,
                                  idle_cells=settings.cache_idle_cells is not None,
                                  model_note=kv_layout.model_note(structure.needs_checkpoints, structure.describe()))
        kv = kv_shape(settings, choice)
        chosen.update(choice=choice, shape=kv)
        return replace(base, kv_unified=not choice.split, n_ctx=kv.n_ctx, n_seq_max=kv.layout.total)

    runtime = LlamaRuntime(base, shape)
    choice, kv = chosen["choice"], chosen["shape"]
    assert isinstance(choice, KVLayoutChoice) and isinstance(kv, KVShape)
    log.info("KV layout: %s (%s)", choice.layout, choice.reason)
    for note in kv.notes:
        log.info("KV layout %s: %s", choice.layout, note)
    try:
        seq_ids = SequenceIdPool(kv.layout)
        info = runtime.info
        # None: llama.cpp's chat layer loads the model's own templates (default and tool_use)
        template_src = settings.chat_template_file.read_text() if settings.chat_template_file else None
        slots = SlotPool(seq_ids.slot_ids)
        structure = ModelMemory.of(info)  # window or recurrent layers: stored tiers need checkpoints
        memory = ModelMemory.of(info, swa_full=settings.swa_full)  # what a slot can cut back
        refused = unsupported_cache_reason(info) if wants_cache else None
        cache_note = refused
        if cache_note:
            log.warning("prefix cache: %s", cache_note)
        router = None
        if wants_cache and not refused:
            router = _build_router(settings, runtime, seq_ids, slots, lambda: list(scheduler.running), path, memory,
                                   partial_state=structure.needs_checkpoints)
            prefix: PrefixProvider = router
        elif memory.needs_checkpoints:  # a slot cut back without its state would attend to missing cells
            prefix = CheckpointedSlotReuse(runtime, memory, reuse=settings.tier_enabled(Source.A),
                                           per_slot=settings.ctx_checkpoints, every=settings.checkpoint_every)
        else:
            prefix = SlotReuseOnly(runtime, reuse=settings.tier_enabled(Source.A))
        if router is not None and runtime.split and settings.tier_enabled(Source.S) and settings.parallel > 1:
            # what tier S costs here: a copy of one stream into another, measured before serving
            router.costs.copy_ms = runtime.time_stream_copy(seq_ids.slot_ids[0], seq_ids.slot_ids[1])
            log.info("KV layout split: a copy between streams costs %.2f ms", router.costs.copy_ms)
        scheduler = Scheduler(
            slots, max_batch_tokens=runtime.n_batch, max_waiting=settings.max_queue,
            reuse=settings.tier_enabled(Source.A),
            # split: each slot's stream holds its request whole (the API keeps a request within it)
            kv_cells=runtime.n_ctx_seq * settings.parallel if runtime.split else settings.ctx_size,
            defer=router.should_defer if router is not None else None,
            prefill_while_decoding=settings.prefill_while_decoding or None,
        )
        speculator, speculative_note = _build_speculator(settings, runtime, slots, memory)
        runner = LlamaRunner(runtime, prefix, speculator)
        engine = Engine(runner, scheduler, deliver)
        engine.start()
    except Exception:
        if speculator is not None:
            speculator.close()
        runtime.close()
        raise
    max_request = max_request_tokens(runtime.n_ctx_seq if runtime.split else settings.ctx_size, info.n_ctx_train)
    embedder, embeddings_note = _build_embedder(settings, runtime)
    log.info(
        "loaded %s (%s, %d layers), n_ctx=%d, %d slots %s, up to %d tokens per request",
        path.name, info.architecture, info.n_layer, runtime.n_ctx, settings.parallel,
        f"with a stream of {runtime.n_ctx_seq} cells each" if runtime.split else f"sharing {settings.ctx_size} cells",
        max_request,
    )
    return LoadedModel(
        runtime=runtime, engine=engine, template_source=template_src, slots=slots, seq_ids=seq_ids, prefix=prefix,
        model_name=default_model_name(settings), cache_note=cache_note, max_request_tokens=max_request,
        router=router, system_fingerprint=system_fingerprint(path), embedder=embedder,
        embeddings_note=embeddings_note, speculator=speculator, speculative_note=speculative_note,
        kv_layout=choice, kv_layout_notes=kv.notes,
    )


class SpeculativeUnavailable(RuntimeError):
    """--spec-type names a drafter this model cannot verify drafts for; the server refuses to start."""


def _build_speculator(settings: ServerSettings, runtime: LlamaRuntime, slots: SlotPool,
                      memory: ModelMemory) -> tuple[Speculator | None, str | None]:
    """The speculator --spec-type asks for, or None and why not. A rejected draft's KV is cut off the end of its
    sequence; a model whose window or recurrent state cannot be cut back (server/cache/checkpoints.py) would need
    the state before the draft, which the engine does not keep per step: `auto` is then off (the reason goes to
    /props), and a drafter named explicitly refuses to start."""
    config = settings.spec_config
    if not config.resolved_types:
        return None, None
    if memory.needs_checkpoints:
        why = (f"speculative decoding is off: {memory.describe()}, whose state cannot be cut back to before a "
               "rejected draft (--swa-full keeps every cell of a sliding-window model and allows it)")
        if settings.spec_type == ("auto",):
            log.warning("%s", why)
            return None, why
        raise SpeculativeUnavailable(f"--spec-type {','.join(settings.spec_type)}: {why}")
    drafter = Drafter(config, len(slots.slots), ctx_tgt=runtime.ctx, n_ctx=runtime.n_ctx, n_batch=runtime.n_batch,
                      n_threads=settings.threads)
    log.info("speculative decoding: %s, %s policy, drafts of up to %d tokens", ",".join(drafter.types),
             "adaptive" if config.adaptive else "always", drafter.n_max)
    return Speculator(drafter, DraftPolicy(adaptive=config.adaptive)), None


def _build_embedder(settings: ServerSettings, runtime: LlamaRuntime) -> tuple[Embedder | None, str | None]:
    """The embeddings context, or why there is none (generation is served either way)."""
    if not settings.embeddings:
        return None, "this server was started without --embeddings"
    try:
        return Embedder(runtime.model, n_ctx=settings.embeddings_ctx, n_threads=settings.threads,
                        pooling=settings.pooling), None
    except EmbeddingsUnavailable as exc:
        log.warning("/v1/embeddings is off: %s", exc)
        return None, str(exc)


def max_request_tokens(ctx_size: int, n_ctx_train: int) -> int:
    """One request may use every cell of the unified KV, but not more positions than the
    model was trained for (0: the GGUF does not say)."""
    return min(ctx_size, n_ctx_train) if n_ctx_train > 0 else ctx_size
