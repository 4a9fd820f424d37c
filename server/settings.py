"""Typed, validated settings of arbor-server (command line flags or ARBOR_SERVER_* env)."""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic.config import JsonDict
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from server.cache.store_url import redact_url
from server.cache.tiers import ON_TREE, Source
from server.engine.kv_types import KVCacheType, is_quantized
from server.settings_cache_policy import CachePolicySettings
from server.settings_speculative import SpeculativeSettings

CACHE_TIERS = (Source.A, Source.S, Source.H, Source.D)  # what --cache-tiers may name (R: --cache-shared)
MIN_SHARED_SECRET_BYTES = 16  # as server.cache.shared_tier.MIN_SECRET_BYTES
# How a thinking model's reasoning comes back (llama-server's names; server.api.engine_bridge.conversation).
ReasoningFormat = Literal["none", "auto", "deepseek", "deepseek-legacy"]
REASONING_FORMATS: tuple[str, ...] = get_args(ReasoningFormat)
# an --allowed-hosts name: '*', a name or IPv4 address (optionally '*.'-prefixed); IPv6 addresses are
# checked by ipaddress. No scheme, no port, no path: a Host header is matched without its port.
_HOST_NAME = re.compile(r"\*|(\*\.)?[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?")


def _host_entry_ok(entry: str) -> bool:
    if ":" not in entry:
        return _HOST_NAME.fullmatch(entry) is not None
    bare = entry[1:-1] if entry.startswith("[") and entry.endswith("]") else entry
    try:
        ipaddress.IPv6Address(bare)
    except ValueError:
        return False
    return True


def physical_cores() -> int:
    """llama.cpp's own default thread count (cpu_get_num_math): one thread per physical core
    this process may run on, hyper-threads not counted (they slow ggml's compute threads
    down, and leave nothing for the Python threads of the server)."""
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    cores = set()
    for cpu in cpus:
        try:
            cores.add(Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text().strip())
        except OSError:
            cores.add(str(cpu))
    return max(1, len(cores))


# Each field is a flag of arbor-server (server/cli.py builds the parser from them) and an
# ARBOR_SERVER_* variable: its description is the flag's help, and the help adds the default
# from the field, so no text here states a default value (only what None or a factory means).
# json_schema_extra: "short" (llama-server's short alias), "flag" (a long name other than the
# field's), "group" (a section of --help, FLAG_GROUPS), "bare" (the value of the flag given
# without one). The flag's type comes from the annotation (bool: a switch; Literal: choices;
# a tuple: comma separated; a dict: a JSON object).
FLAG_GROUPS = {
    "prefix cache": "where prefixes' KV is kept and reused: tiers A (the slot's own), S (resident), H (host), "
                    "D (disk)",
    "shared store": "tier R: KV chunks in a Redis/Valkey store shared by the replicas of this model",
    "KV events": "the radix tree's changes as vLLM/SGLang-format ZMQ events, for KV-event routers (Dynamo, llm-d)",
    "request limits": "larger requests get a 4xx answer that names the flag",
    "speculative decoding": "drafts the target verifies in one step, from llama.cpp's drafters (llama-server's "
                            "--spec-* flags; docs/server.md)",
}
_CACHE: JsonDict = {"group": "prefix cache"}
_SHARED: JsonDict = {"group": "shared store"}
_EVENTS: JsonDict = {"group": "KV events"}
_LIMITS: JsonDict = {"group": "request limits"}


class ServerSettings(CachePolicySettings, SpeculativeSettings, BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ARBOR_SERVER_", extra="forbid")

    model: Path | None = Field(None, description="GGUF model file (default: the embedded SmolLM2-135M-Instruct)",
                               json_schema_extra={"short": "-m"})
    host: str = Field("127.0.0.1", description="address to bind")
    port: int = Field(8080, ge=0, le=65535, description="port")
    parallel: int = Field(4, ge=1, le=64, description="slots: requests computed concurrently",
                          json_schema_extra={"short": "-np"})
    ctx_size: int = Field(8192, ge=256, description="total KV cells of the slots: in the unified layout one pool "
                          "shared by them, which one request may use whole (up to the model's training context); "
                          "in the split layout a stream of --ctx-size / --parallel cells per slot",
                          json_schema_extra={"short": "-c"})
    kv_layout: Literal["auto", "unified", "split"] = Field(
        "auto", description="unified: one KV shared by every slot, prefixes shared in place, paged attention where "
        "it pays; split: a KV stream per slot (llama-server without --kv-unified), prefixes copied between "
        "streams; auto: the layout measured fastest for the backend (split with layers on a GPU/NPU, unified "
        "on the CPU); /props arbor.kv_layout says which and why")
    batch_size: int = Field(512, ge=16, le=8192, description="tokens per decode step",
                            json_schema_extra={"short": "-b"})
    prefill_while_decoding: int = Field(
        0, ge=0, le=8192, description="prompt tokens a step carries while other requests decode (0: the rest of "
        "--batch-size); smaller keeps their streams moving during a long prompt at some cost to its prefill "
        "(docs/benchmarks.md, hostile requests, measures 128)")
    stream_interval_ms: float = Field(
        10.0, ge=0, le=1000, description="longest a streamed token waits to be sent with the ones after it: while "
        "a stream's tokens come faster, it gets one chunk per interval (fewer socket writes and reply parses per "
        "token for the HTTP front end); a request's first token and its end are sent at once; 0 sends every token "
        "as it is sampled, as llama-server does")
    threads: int = Field(default_factory=physical_cores, ge=1, description="CPU threads (default: physical cores, "
                         "as llama.cpp)", json_schema_extra={"short": "-t"})
    threads_batch: int | None = Field(
        None, ge=1, description="CPU threads of a step of more than one token (prompt chunks, several streams' "
        "decode tokens); --threads then counts those of a one-token step (default: --threads, as llama.cpp)",
        json_schema_extra={"short": "-tb"})
    alias: str | None = Field(None, description="model name clients use (default: the file name)")
    strict_model_name: bool = Field(False, description="answer 404 to a request naming another model (without it: "
                                    "serve the one model whatever the name, as llama-server does)")
    api_key: str | None = Field(None, repr=False,
                                description="require 'Authorization: Bearer KEY' (or 'x-api-key: KEY') on every "
                                "route but /health; several keys separated by commas (as llama-server's)")
    cache_salt_per_key: bool = Field(
        False, description="cache isolation per API key: each request's prefix cache is that of the --api-key "
        "key it authenticated with (a hash of the key salts it, with its cache_salt if any): requests under "
        "different keys never share KV (docs/server.md, Cache isolation)", json_schema_extra=_CACHE)
    chat_template_file: Path | None = Field(None, description="a Jinja chat template to use instead of the model's")
    reasoning_format: ReasoningFormat = Field(
        "auto", description="how a thinking model's reasoning comes back (llama-server's --reasoning-format): "
        "auto/deepseek in message.reasoning_content, none left in the content")
    reasoning_budget: int = Field(-1, ge=-1, description="tokens a thinking model may reason before its end tag is "
                                  "forced (llama-server's --reasoning-budget; -1: no limit; a request's "
                                  "reasoning_budget_tokens overrides)")
    reasoning_budget_message: str = Field("", description="text written before the forced end tag")
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="extra variables for every render of the chat template, a JSON object, "
        "e.g. '{\"enable_thinking\": false}'; a request's chat_template_kwargs override them")
    no_cache: bool = Field(False, description="disable every kind of prefix reuse (the benchmark baseline)")
    max_queue: int = Field(64, ge=0, description="requests that may wait for a slot before 503")
    n_gpu_layers: int = Field(0, ge=-1, description="layers to offload to a GPU or NPU (-1: all); with no such "
                              "device the server refuses to start, see --allow-cpu-fallback",
                              json_schema_extra={"short": "-ngl"})
    allow_cpu_fallback: bool = Field(False, description="with --n-gpu-layers and no GPU/NPU device, run on the CPU "
                                     "on purpose (a warning, /props says so) instead of refusing to start")
    flash_attn: Literal["auto", "on", "off"] = Field("auto", description="llama.cpp's flash attention; auto: where "
                                                     "the backend supports it")
    cache_type_k: KVCacheType = Field(
        "f16", description="element type of the KV cache's K (llama-server's -ctk); a quantized type holds more "
        "tokens per MiB on the device and in the host and disk tiers", json_schema_extra={"short": "-ctk"})
    cache_type_v: KVCacheType = Field(
        "f16", description="element type of the KV cache's V (llama-server's -ctv); a quantized V needs flash "
        "attention", json_schema_extra={"short": "-ctv"})
    paged_attn: Literal["auto", "on", "off"] = Field(
        "auto", description="paged attention over the unified KV: each sequence reads only the pages of cells it "
        "owns (our llama.cpp patch); auto: on where the backend has the kernel (the CPU); on (also a bare "
        "--paged-attn): refuse to start without it; off: llama.cpp's attention over every cell",
        json_schema_extra={"bare": "on"})
    page_size: int = Field(16, ge=1, le=4096, description="KV cells per page of paged attention")
    page_placement: Literal["owned", "shared"] = Field(
        "owned", description="where paged attention puts a step's tokens: owned (each sequence fills pages of its "
        "own, so a stream walks only its own cells; docs/paged-attention.md) or shared (llama.cpp's placement, the "
        "next free cells: streams decoding together share pages and walk each other's decode cells)")
    # cache (server/cache)
    cache_tiers: tuple[str, ...] = Field(("A", "S", "H"), description="prefix sources to use, comma separated "
                                         "among A,S,H,D", json_schema_extra=_CACHE)
    cache_ram: int = Field(1024, ge=0, description="host tier budget, MiB", json_schema_extra=_CACHE)
    cache_dir: Path | None = Field(None, description="directory of the disk tier (adds D to the default tiers; "
                                   "with --cache-tiers, list D there)", json_schema_extra=_CACHE)
    cache_disk: int = Field(4096, ge=0, description="disk tier budget, MiB", json_schema_extra=_CACHE)
    cache_disk_queue: int = Field(64, ge=1, description="MiB of KV waiting for the disk writer (and, apart, of "
                                  "state checkpoints waiting for theirs); a store beyond it is dropped and "
                                  "counted (queued KV is held outside every budget)",
                                  json_schema_extra=_CACHE)
    cache_disk_reserve_mb: int = Field(1024, ge=0, description="MiB the cache directory's filesystem keeps free: a "
                                       "disk-tier write that would leave less first evicts the tier's own files, "
                                       "then is declined and counted (requests go on without D); 0: no reserve",
                                       json_schema_extra=_CACHE)
    resident_cells: int = Field(2048, ge=0, description="KV cells that resident prefix owners may hold (unified "
                                "KV: beyond the cells a slot or parked copy also holds)",
                                json_schema_extra=_CACHE)
    cache_sessions: int = Field(4096, ge=1, description="sessions whose lifecycle hints the cache remembers; "
                                "past it the least recently seen is forgotten", json_schema_extra=_CACHE)
    cache_session_idle: float = Field(3600.0, gt=0, description="seconds after its last hint that a session "
                                      "(pinned or not) is forgotten", json_schema_extra=_CACHE)
    cache_max_pinned_sessions: int = Field(64, ge=0, description="sessions that may be pinned at once (pinned KV "
                                           "is never evicted); a new pin beyond it releases the oldest pin",
                                           json_schema_extra=_CACHE)
    cache_max_pinned_mb: int = Field(512, ge=0, description="MiB of host and disk KV that pinned sessions may hold; "
                                     "beyond it the oldest pins are released (their KV becomes evictable)",
                                     json_schema_extra=_CACHE)
    cache_route: Literal["cost", "longest"] = Field(
        "cost", description="cost: the plan with the lowest estimated time to first token, from measured rates; "
        "longest: the longest match", json_schema_extra=_CACHE)
    cache_min_tokens: int = Field(32, ge=1, description="shortest prefix worth storing or publishing",
                                  json_schema_extra=_CACHE)
    ctx_checkpoints: int = Field(
        8, ge=0, description="state checkpoints kept per slot on models with sliding-window or recurrent layers "
        "(llama-server's --ctx-checkpoints): a slot resumes from the newest one at or below a shared prefix; "
        "0: none (such a slot is reused only up to where its state still is)",
        json_schema_extra={**_CACHE, "short": "-ctxcp"})
    swa_full: bool = Field(
        False, description="sliding-window layers keep every cell, as full attention does (llama-server's "
        "--swa-full): slots cut back without checkpoints, at the KV memory of a full-attention model",
        json_schema_extra=_CACHE)
    cache_checkpoint_ram: int = Field(
        1024, ge=0, description="MiB of host RAM for the state checkpoints that tiers H and D restore with on "
        "models with sliding-window or recurrent layers (the least recently used go first)", json_schema_extra=_CACHE)
    cache_checkpoint_disk: int = Field(
        1024, ge=0, description="MiB of the cache directory for the state checkpoints tier D restores with after a "
        "restart (with --cache-dir; the oldest go first); 0: none on disk", json_schema_extra=_CACHE)
    checkpoint_every: int = Field(
        1024, ge=0, description="tokens between the state checkpoints taken while a long prompt is computed "
        "(one more is always taken before the prompt's last token); 0: only that one", json_schema_extra=_CACHE)
    cache_write_back_step: int = Field(4096, ge=0, description="KiB of a parked slot's KV written back to host per "
                                       "engine step; 0: write a slot back at once when it is reused (stalls "
                                       "decoding for the whole copy)", json_schema_extra=_CACHE)
    cache_restore_step: int = Field(8192, ge=0, description="KiB of host, disk or shared-store KV restored into a "
                                    "request's slot per engine step while other requests compute (the request waits "
                                    "for its own restore only); 0: each restore whole at admission (stalls decoding "
                                    "for the whole copy)", json_schema_extra=_CACHE)
    cache_restore_beside: Literal["auto", "off"] = Field(
        "auto", description="auto: where no attention kernel reads a cell masked for it (paged attention on the "
        "CPU), a restore beside computing requests takes its cells at once and writes its K and V on a thread of "
        "its own while they compute; off (or where the kernels may read masked cells): in pieces of "
        "--cache-restore-step between their steps", json_schema_extra=_CACHE)
    cache_write_back_beside: Literal["auto", "off"] = Field(
        "auto", description="auto: where the KV can be read beside computing requests (paged attention on the "
        "CPU), a parked slot's KV is copied to host on a thread of its own while they compute; off (or where it "
        "cannot): in pieces of --cache-write-back-step between their steps", json_schema_extra=_CACHE)
    cache_idle_cells: int | None = Field(
        None, ge=0, description="KV cells idle slots may keep on the device while other requests run; beyond "
        "it the least recently used idle slot is written back to host or disk and freed (with unified KV every "
        "kept cell slows every running request's steps: bench/idle_cells.py); default: no limit",
        json_schema_extra=_CACHE)
    # the shared store, tier R (server/cache/shared_tier.py)
    cache_shared: str | None = Field(
        None, repr=False, description="URL of the store (redis://, rediss:// or unix://, e.g. "
        "redis://127.0.0.1:6379/0): chunks of the host tier's KV are written there and restored from there; needs "
        "tier H (default: off)", json_schema_extra=_SHARED)
    cache_shared_chunk: int = Field(64, ge=16, le=8192, description="tokens per chunk in the shared store "
                                    "(bench/shared_chunk.py)", json_schema_extra=_SHARED)
    cache_shared_timeout_ms: float = Field(50.0, gt=0, description="timeout of the shared-store lookup at "
                                           "admission (engine thread), ms; a failure leaves the store alone 5 s",
                                           json_schema_extra=_SHARED)
    cache_shared_queue: int = Field(64, ge=1, description="MiB of KV waiting for the shared-store writer; "
                                    "a store beyond it is dropped and counted", json_schema_extra=_SHARED)
    cache_shared_secret: SecretStr | None = Field(
        None, description="the deployment secret every replica sharing the store holds (at least 16 bytes, e.g. "
        "`openssl rand -hex 32`): values are MACed with it and keys derived from it; required with "
        "--cache-shared. Prefer --cache-shared-secret-file or ARBOR_SERVER_CACHE_SHARED_SECRET: a command line is "
        "visible to every local user", json_schema_extra=_SHARED)
    cache_shared_secret_file: Path | None = Field(
        None, description="a file holding the shared-store secret (a docker secret; surrounding whitespace "
        "ignored)", json_schema_extra=_SHARED)
    cache_shared_max_value_mb: int = Field(64, ge=1, description="MiB: a longer shared-store value is refused "
                                           "from its length, before it is read (and not written)",
                                           json_schema_extra=_SHARED)
    # KV events for exact-routing routers (server/cache/kv_events.py)
    kv_events_endpoint: str | None = Field(
        None, description="publish the radix tree's KV block changes (BlockStored/BlockRemoved/AllBlocksCleared) "
        "on this ZMQ endpoint: a bare port (5557) binds loopback; tcp://*:5557 binds every interface (the events "
        "carry the token ids of every cached prefix: anyone reaching the port reads them); tcp://host:port "
        "connects; ipc://PATH binds (default: off)", json_schema_extra=_EVENTS)
    kv_events_topic: str = Field("", description="ZMQ topic of the KV events", json_schema_extra=_EVENTS)
    kv_events_block_size: int = Field(16, ge=1, le=4096, description="tokens per announced block",
                                      json_schema_extra=_EVENTS)
    # NoDecode: a comma-separated list in the environment (ARBOR_SERVER_CORS_ORIGINS=a,b), not JSON
    cors_origins: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="origins browsers may call from, comma separated ('*': any; default: localhost origins "
        "only)")
    allowed_hosts: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="names clients may reach the server by (the Host header; comma separated, "
        "'*.example.com' for subdomains), besides localhost, 127.0.0.1, ::1 and a specific --host; '*': any "
        "(behind a proxy that checks Host, or in compose where other containers call the server by its service "
        "name). server/api/http/host_check.py")
    embeddings: bool = Field(False, description="serve /v1/embeddings from a second, small llama.cpp context")
    pooling: Literal["model", "mean", "cls", "last"] = Field("model", description="embedding pooling; model: as "
                                                             "the GGUF says (generative models say none)")
    embeddings_ctx: int = Field(512, ge=8, description="most tokens of one embeddings input")
    responses_store: int = Field(1024, ge=0, description="responses the Responses API keeps for previous_response_id "
                                 "and GET /v1/responses/{id} (oldest evicted first; 0: none is kept)")
    responses_store_mb: int = Field(64, ge=1, description="MiB of JSON the kept responses may hold (their input and "
                                    "output items; oldest evicted first)")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="the server's log level "
                                                                    "(uvicorn's too)")
    # request limits (server/api/http/request_guard.py): hostile or broken clients get a 4xx, not a
    # slow or crashed server; the defaults are far above what agent traffic sends.
    max_body_kib: int = Field(4096, ge=1, description="largest request body, KiB (413 beyond)",
                              json_schema_extra=_LIMITS)
    max_json_depth: int = Field(64, ge=2, le=512, description="deepest nesting of a JSON body",
                                json_schema_extra=_LIMITS)
    max_messages: int = Field(1024, ge=1, description="messages per chat request", json_schema_extra=_LIMITS)
    max_tools: int = Field(128, ge=0, description="tools per chat request", json_schema_extra=_LIMITS)
    max_stop: int = Field(16, ge=0, description="stop strings per request", json_schema_extra=_LIMITS)
    max_stop_chars: int = Field(256, ge=1, description="characters in one stop string", json_schema_extra=_LIMITS)
    max_choices: int = Field(8, ge=1, le=64, description="largest n (choices sampled from one prompt per request)",
                             json_schema_extra=_LIMITS)
    max_tools_kib: int = Field(256, ge=1, description="KiB of JSON of one request's tool definitions",
                               json_schema_extra=_LIMITS)
    max_grammar_chars: int = Field(65536, ge=1, description="characters of a request's GBNF grammar",
                                   json_schema_extra=_LIMITS)
    max_schema_kib: int = Field(64, ge=1, description="KiB of JSON of a request's response_format.json_schema "
                                "(or llama-server's json_schema)", json_schema_extra=_LIMITS)
    max_logit_bias: int = Field(1024, ge=0, description="logit_bias entries per request", json_schema_extra=_LIMITS)
    max_embeddings_inputs: int = Field(256, ge=1, description="inputs of one /v1/embeddings request",
                                       json_schema_extra=_LIMITS)

    @field_validator("cache_tiers", mode="before")
    @classmethod
    def _parse_tiers(cls, v):
        if isinstance(v, str):
            v = [t.strip().upper() for t in v.split(",") if t.strip()]
        tiers = tuple(dict.fromkeys(str(t).upper() for t in v))
        bad = [t for t in tiers if t not in CACHE_TIERS]
        if bad:
            raise ValueError(f"unknown cache tier(s) {bad}; choose among {','.join(CACHE_TIERS)}")
        return tiers

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _parse_origins(cls, v):
        if isinstance(v, str):
            v = [o.strip() for o in v.split(",") if o.strip()]
        origins = tuple(str(o).rstrip("/") for o in v)
        bad = [o for o in origins if o != "*" and not o.startswith(("http://", "https://"))]
        if bad:
            raise ValueError(f"CORS origins look like scheme://host[:port] or '*', got {bad}")
        return origins

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _parse_hosts(cls, v):
        if isinstance(v, str):
            v = v.split(",")
        hosts = tuple(dict.fromkeys(str(h).strip().lower() for h in v if str(h).strip()))
        bad = [h for h in hosts if not _host_entry_ok(h)]
        if bad:
            raise ValueError(f"allowed hosts are names or addresses without scheme or port (a.example, "
                             f"*.example.com, 10.0.0.5, [::1]) or '*', got {bad}")
        return hosts

    @field_validator("model", "chat_template_file")
    @classmethod
    def _file_exists(cls, v: Path | None):
        if v is not None and not v.is_file():
            raise ValueError(f"file not found: {v}")
        return v

    @model_validator(mode="after")
    def _consistent(self):
        if self.batch_size < self.parallel:
            raise ValueError(f"--batch-size ({self.batch_size}) must be at least --parallel ({self.parallel})")
        if Source.D in self.cache_tiers and self.cache_dir is None:
            raise ValueError("cache tier D needs --cache-dir")
        if self.cache_dir is not None and Source.D not in self.cache_tiers:
            if "cache_tiers" in self.model_fields_set:
                raise ValueError(f"--cache-dir {self.cache_dir} is given but --cache-tiers "
                                 f"{','.join(self.cache_tiers)} leaves out D; add D or drop --cache-dir")
            self.cache_tiers = (*self.cache_tiers, Source.D.value)  # the default tiers plus the disk asked for
        if self.kv_layout == "split" and self.paged_attn == "on":
            raise ValueError("--paged-attn on pages one unified KV; --kv-layout split gives each slot a stream of "
                             "its own: drop one of them (or use --kv-layout auto, which then takes unified)")
        if self.kv_layout == "split" and self.cache_idle_cells is not None:
            raise ValueError("--cache-idle-cells bounds the idle cells of the unified KV, which every running "
                             "request's attention walks; with --kv-layout split each slot's stream is its own: "
                             "drop one of them")
        if self.paged_attn == "on" and self.flash_attn == "off":
            raise ValueError("--paged-attn on needs flash attention (its kernel is a flash-attention kernel); "
                             "drop --flash-attn off or use --paged-attn auto|off")
        if is_quantized(self.cache_type_v) and self.flash_attn == "off":
            raise ValueError(f"--cache-type-v {self.cache_type_v} needs flash attention: without it llama.cpp keeps V "
                             "transposed, one element per cell, which a quantized type (blocks of 32) cannot be; drop "
                             "--flash-attn off or use --cache-type-v f16, bf16 or f32")
        if self.api_key and not any(k.strip() for k in self.api_key.split(",")):
            raise ValueError("--api-key names no key (several are separated by commas)")
        if self.cache_salt_per_key and not self.api_key:
            raise ValueError("--cache-salt-per-key isolates the cache of each --api-key key: it needs --api-key")
        if self.kv_events_endpoint is not None and not any(self.tier_enabled(t) for t in ON_TREE):
            off = ", --no-cache" if self.no_cache else ""
            raise ValueError("--kv-events-endpoint publishes the radix tree, which only tiers S, H and D fill: "
                             f"enable one (tiers: {','.join(self.cache_tiers)}{off})")
        if self.allow_cpu_fallback and self.n_gpu_layers == 0:
            raise ValueError("--allow-cpu-fallback only matters with --n-gpu-layers (layers asked of an accelerator); "
                             "with --n-gpu-layers 0 the server runs on the CPU anyway: drop it or set --n-gpu-layers")
        if self.cache_idle_cells is not None and not (self.tier_enabled(Source.H) or self.tier_enabled(Source.D)):
            raise ValueError("--cache-idle-cells writes idle slots back to host or disk: it needs tier H or D "
                             f"(tiers: {','.join(self.cache_tiers)}{', --no-cache' if self.no_cache else ''})")
        if self.cache_shared is not None and not self.tier_enabled(Source.H):
            raise ValueError("--cache-shared writes the host tier's KV to the store: it needs tier H "
                             f"(tiers: {','.join(self.cache_tiers)}{', --no-cache' if self.no_cache else ''})")
        if self.cache_shared is not None and not self.cache_shared.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"--cache-shared {redact_url(self.cache_shared)!r}: expected a redis://, rediss:// or "
                             "unix:// URL")
        self._resolve_shared_secret()
        return self

    def _resolve_shared_secret(self) -> None:
        """Read --cache-shared-secret-file into cache_shared_secret; refuse a store without a
        secret (any process that can write to it could otherwise plant KV every replica
        restores) and a secret too short to be a key."""
        if self.cache_shared_secret is not None and self.cache_shared_secret_file is not None:
            raise ValueError("give --cache-shared-secret or --cache-shared-secret-file, not both")
        if self.cache_shared_secret_file is not None:
            try:
                text = self.cache_shared_secret_file.read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError) as exc:
                raise ValueError(f"--cache-shared-secret-file {self.cache_shared_secret_file}: "
                                 f"cannot read it ({type(exc).__name__})") from exc
            self.cache_shared_secret = SecretStr(text)
        if self.cache_shared is None:
            return
        secret = self.cache_shared_secret.get_secret_value() if self.cache_shared_secret is not None else ""
        if not secret:
            raise ValueError("--cache-shared needs the deployment's secret: --cache-shared-secret-file PATH or "
                             "ARBOR_SERVER_CACHE_SHARED_SECRET (the same on every replica; e.g. "
                             "`openssl rand -hex 32`). Without it anyone who can write to the store could plant "
                             "KV that every replica restores")
        if len(secret.encode()) < MIN_SHARED_SECRET_BYTES:
            raise ValueError(f"--cache-shared-secret: at least {MIN_SHARED_SECRET_BYTES} bytes, e.g. "
                             "`openssl rand -hex 32`")

    @property
    def slot_share(self) -> int:
        """An even split of the cells among the slots: what a request without max_tokens is
        guaranteed for prompt + output (it may grow further while cells are free)."""
        return self.ctx_size // self.parallel

    @property
    def batch_threads(self) -> int:
        """Threads of a step of more than one token: --threads-batch, else --threads."""
        return self.threads_batch or self.threads

    def tier_enabled(self, tier: str) -> bool:
        return not self.no_cache and tier in self.cache_tiers
