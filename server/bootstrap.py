"""Composition root: settings -> llama.cpp runtime -> prefix provider -> engine.

This is the only module that knows how the pieces fit; routes receive the finished
`LoadedModel` through `server.api.state`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from server.api.chat_template import ChatTemplate
from server.engine.engine import Engine
from server.engine.llama_runtime import LlamaRuntime, RuntimeConfig, UnsupportedModel
from server.engine.runner import LlamaRunner, PrefixProvider, SlotReuseOnly
from server.engine.scheduler import Scheduler
from server.engine.seq_ids import SequenceIdLayout, SequenceIdPool
from server.engine.slots import SlotPool
from server.model_file import embedded_model_path
from server.settings import ServerSettings

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    runtime: LlamaRuntime
    engine: Engine
    template: ChatTemplate
    slots: SlotPool
    seq_ids: SequenceIdPool
    prefix: PrefixProvider
    model_name: str
    cache_note: str | None  # why some cache tiers are off, when they are

    def close(self) -> None:
        self.engine.stop()
        self.runtime.close()


def model_path(settings: ServerSettings) -> Path:
    return settings.model or embedded_model_path()


def default_model_name(settings: ServerSettings) -> str:
    return settings.alias or model_path(settings).stem


def load(settings: ServerSettings) -> LoadedModel:
    path = model_path(settings)
    layout = SequenceIdLayout(slots=settings.parallel, owners=0, scratch=0)
    seq_ids = SequenceIdPool(layout)
    flash = {"auto": None, "on": True, "off": False}[settings.flash_attn]
    runtime = LlamaRuntime(
        RuntimeConfig(
            model_path=path,
            n_ctx=settings.ctx_size,
            n_batch=settings.batch_size,
            n_seq_max=layout.total,
            n_threads=settings.threads,
            n_threads_batch=settings.threads,
            n_gpu_layers=settings.n_gpu_layers,
            flash_attn=flash,
        )
    )
    try:
        info = runtime.info
        if info.is_recurrent or info.is_hybrid:
            raise UnsupportedModel(
                f"{info.architecture} uses recurrent state; Arbor serves full-attention text models only"
            )
        if settings.chat_template_file:
            template_src = settings.chat_template_file.read_text()
        else:
            template_src = info.chat_template
        template = ChatTemplate(template_src, bos_token=info.bos_token, eos_token=info.eos_token)
        slots = SlotPool(seq_ids.slot_ids)
        prefix = SlotReuseOnly(runtime, reuse=settings.tier_enabled("A"))
        cache_note = None
        runner = LlamaRunner(runtime, prefix)
        scheduler = Scheduler(
            slots, max_batch_tokens=runtime.n_batch, max_waiting=settings.max_queue, reuse=settings.tier_enabled("A")
        )
        engine = Engine(runner, scheduler)
        engine.start()
    except Exception:
        runtime.close()
        raise
    log.info(
        "loaded %s (%s, %d layers), n_ctx=%d, %d slots of %d tokens",
        path.name, info.architecture, info.n_layer, runtime.n_ctx, settings.parallel, settings.slot_ctx,
    )
    return LoadedModel(
        runtime=runtime, engine=engine, template=template, slots=slots, seq_ids=seq_ids, prefix=prefix,
        model_name=default_model_name(settings), cache_note=cache_note,
    )
