"""The workbench's spans exported over OTLP with the OpenTelemetry SDK: one trace per turn.

Off unless the standard variables say where: `OTEL_EXPORTER_OTLP_ENDPOINT` (or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), read with the rest of the OTLP exporter's standard
variables (headers, timeout, compression) by the SDK's OTLP/HTTP protobuf exporter;
`OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` keep it off; `OTEL_SERVICE_NAME` names the
service (default `arbor-workbench`), `OTEL_RESOURCE_ATTRIBUTES` adds to it.

What a collector receives, for each turn (the trace id is derived from the turn id, so every
segment of a turn paused for an approval, in whichever workbench process, is one trace):

    invoke_agent <scenario>        the graph's run (one per segment), kind INTERNAL, with
                                   gen_ai.agent.name, gen_ai.conversation.id, arbor.turn.id
      chat <model>                 each model call, kind CLIENT: the span the workbench records
                                   (app/tracing.py), its GenAI attributes (usage, cached tokens) and
                                   Arbor's (arbor.cache.source, reused_tokens, restore_ms,
                                   arbor.speculative.draft_tokens / accepted_tokens). Its id goes
                                   to the server as the request's W3C `traceparent`, so the
                                   server's own span of that request is its child.
      execute_tool <tool>          each tool call
      compacted                    each compaction of the history

Export never slows a turn: finished spans go into a bounded queue (`OTEL_BSP_MAX_QUEUE_SIZE`,
2048) that a thread of its own sends in batches (`OTEL_BSP_MAX_EXPORT_BATCH_SIZE`, 512, every
`OTEL_BSP_SCHEDULE_DELAY` ms, 1000 here); a span that finds the queue full, or whose batch the
collector does not take (unreachable, refused, timed out), is dropped and counted
(`Telemetry.stats()`, shown by GET /api/health).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.tracers.context import register_configure_hook
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

log = logging.getLogger(__name__)

SERVICE_NAME = "arbor-workbench"
#: LangChain creates a `GraphSpans` handler for every run while this variable is "true" (set by `start`)
CALLBACK_SWITCH = "ARBOR_OTLP_GRAPH_SPANS"


def configured(environ: dict[str, str] | None = None) -> bool:
    """Whether the standard variables ask for OTLP export of traces."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() in ("none", ""):
        return False
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def _env_number(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, "") or default)
    except ValueError:
        log.warning("%s=%r is not a number; using %s", name, os.environ.get(name), default)
        return default


def turn_trace_id(turn_id: str) -> int:
    """The trace id of a turn: the same in every process and every segment of it."""
    return int.from_bytes(hashlib.sha256(f"arbor-turn:{turn_id}".encode()).digest()[:16], "big") or 1


def traceparent(trace_id: int, span_id: int) -> str:
    return f"00-{trace_id:032x}-{span_id:016x}-01"


def parse_traceparent(value: str | None) -> tuple[int, int] | None:
    parts = (value or "").split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        return int(parts[1], 16), int(parts[2], 16)
    except ValueError:
        return None


class BoundedExport(SpanProcessor):
    """Finished spans into a bounded queue, exported in batches by a thread of its own; what
    does not fit, and what the collector does not take, is dropped and counted."""

    def __init__(self, exporter: SpanExporter, *, max_queue: int, batch: int, delay_s: float) -> None:
        self.exporter, self.max_queue, self.batch, self.delay_s = exporter, max(1, max_queue), max(1, batch), delay_s
        self.queue: deque[ReadableSpan] = deque()
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.exported = self.dropped = self.failed_exports = 0
        self._stopping = False
        self._idle = threading.Event()
        self._idle.set()
        self.thread = threading.Thread(target=self._run, name="arbor-otlp-export", daemon=True)
        self.thread.start()

    def on_start(self, span: Any, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        with self.lock:
            if self._stopping or len(self.queue) >= self.max_queue:
                self.dropped += 1
                return
            self.queue.append(span)
            full = len(self.queue) >= self.batch
        if full:
            self.wake.set()

    def _take(self) -> list[ReadableSpan]:
        with self.lock:
            batch = [self.queue.popleft() for _ in range(min(self.batch, len(self.queue)))]
            if batch:
                self._idle.clear()
            return batch

    def _run(self) -> None:
        while True:
            self.wake.wait(self.delay_s)
            self.wake.clear()
            while batch := self._take():
                self._export(batch)
            self._idle.set()
            if self._stopping:
                return

    def _export(self, batch: Sequence[ReadableSpan]) -> None:
        try:
            result = self.exporter.export(batch)
        except Exception:
            log.debug("OTLP export raised", exc_info=True)
            result = SpanExportResult.FAILURE
        with self.lock:
            if result == SpanExportResult.SUCCESS:
                self.exported += len(batch)
            else:
                self.dropped += len(batch)
                self.failed_exports += 1

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Send what is queued now; False when it is not all sent within the timeout."""
        deadline = time.monotonic() + timeout_millis / 1000
        while time.monotonic() < deadline:
            with self.lock:
                empty = not self.queue
            if empty and self._idle.is_set():
                return True
            self.wake.set()
            time.sleep(0.01)
        return False

    def shutdown(self) -> None:
        self.force_flush(int(_env_number("OTEL_BSP_EXPORT_TIMEOUT", 5000)))
        with self.lock:
            self._stopping = True
        self.wake.set()
        self.thread.join(timeout=5)
        self.exporter.shutdown()

    def stats(self) -> dict[str, int]:
        with self.lock:
            return {"exported": self.exported, "dropped": self.dropped, "queued": len(self.queue),
                    "failed_exports": self.failed_exports, "max_queue": self.max_queue}


class _ChosenIds(IdGenerator):
    """Random ids, except a span id chosen for the next span started on this thread (a model
    call's span gets the id its request's traceparent already named)."""

    def __init__(self) -> None:
        self.random = RandomIdGenerator()
        self.local = threading.local()

    def generate_span_id(self) -> int:
        chosen = getattr(self.local, "span_id", None)
        self.local.span_id = None
        return chosen or self.random.generate_span_id()

    def generate_trace_id(self) -> int:
        return self.random.generate_trace_id()


class Telemetry:
    """The workbench's tracer provider and how its spans are made (one per process)."""

    def __init__(self, exporter: SpanExporter, *, max_queue: int = 2048, batch: int = 512,
                 delay_s: float = 1.0) -> None:
        self.ids = _ChosenIds()
        attributes = {"service.name": os.environ.get("OTEL_SERVICE_NAME") or SERVICE_NAME}
        self.provider = TracerProvider(resource=Resource.create(attributes), id_generator=self.ids)
        self.processor = BoundedExport(exporter, max_queue=max_queue, batch=batch, delay_s=delay_s)
        self.provider.add_span_processor(self.processor)
        self.tracer = self.provider.get_tracer("arbor.workbench")
        self.roots: dict[str, SpanContext] = {}  # turn id -> its running graph span (one segment at a time)
        self.graph_spans: dict[UUID, tuple[str, Any]] = {}  # LangChain run id -> (turn id, span)
        self.lock = threading.Lock()

    # -- a turn's graph run (GraphSpans calls these) ---------------------------------------------
    def graph_started(self, run_id: UUID, metadata: dict) -> None:
        turn_id = metadata.get("turn_id")
        if not turn_id:
            return
        parent = NonRecordingSpan(SpanContext(turn_trace_id(turn_id), 1, is_remote=True,
                                              trace_flags=TraceFlags(TraceFlags.SAMPLED)))
        attributes = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": metadata.get("scenario") or "",
                      "gen_ai.conversation.id": metadata.get("session_id") or "", "arbor.turn.id": turn_id,
                      "arbor.branch.id": metadata.get("branch_id") or ""}
        span = self.tracer.start_span(f"invoke_agent {metadata.get('scenario') or 'agent'}",
                                      context=trace.set_span_in_context(parent), kind=SpanKind.INTERNAL,
                                      attributes={k: v for k, v in attributes.items() if v})
        with self.lock:
            self.graph_spans[run_id] = (turn_id, span)
            self.roots[turn_id] = span.get_span_context()

    def graph_ended(self, run_id: UUID, error: BaseException | None = None) -> None:
        with self.lock:
            found = self.graph_spans.pop(run_id, None)
            if found is not None and self.roots.get(found[0]) == found[1].get_span_context():
                del self.roots[found[0]]
        if found is None:
            return
        span = found[1]
        if error is not None and not _is_interrupt(error):
            span.set_status(Status(StatusCode.ERROR, str(error)[:500]))
            span.set_attribute("error.type", type(error).__name__)
        span.end()

    # -- the spans app/tracing.py records ---------------------------------------------------------
    def model_traceparent(self, turn_id: str) -> str:
        """A new span id for a model call of turn `turn_id`, as the request's traceparent."""
        return traceparent(turn_trace_id(turn_id), self.ids.random.generate_span_id())

    def record(self, *, turn_id: str, name: str, kind: str, started_at: datetime, duration_ms: float | None,
               attributes: dict | None, error: str | None, traceparent_value: str | None = None) -> None:
        """One finished span of turn `turn_id` (a model call, tool call or compaction), under the
        turn's running graph span (the trace's root when none runs here)."""
        with self.lock:
            root = self.roots.get(turn_id)
        trace_id = turn_trace_id(turn_id)
        parent = root or SpanContext(trace_id, 1, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
        chosen = parse_traceparent(traceparent_value)
        if chosen is not None and chosen[0] == trace_id:
            self.ids.local.span_id = chosen[1]
        start_ns = int(_utc_timestamp(started_at) * 1e9)
        span = self.tracer.start_span(
            name, context=trace.set_span_in_context(NonRecordingSpan(parent)),
            kind=SpanKind.CLIENT if kind == "model" else SpanKind.INTERNAL, start_time=start_ns,
            attributes={"arbor.turn.id": turn_id, "arbor.span.kind": kind, **_otel_attributes(attributes or {})})
        if error:
            span.set_status(Status(StatusCode.ERROR, error[:500]))
        span.end(end_time=start_ns + int((duration_ms or 0.0) * 1e6))

    def stats(self) -> dict[str, int]:
        return self.processor.stats()

    def flush(self, timeout_s: float = 10.0) -> bool:
        return self.processor.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        self.provider.shutdown()


def _utc_timestamp(moment: datetime) -> float:
    if moment.tzinfo is None:  # SQLite's naive datetimes were written in UTC
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _otel_attributes(attributes: dict) -> dict:
    """Span attributes as OTel takes them: scalars, and lists of one scalar type; the rest as text."""
    out: dict[str, Any] = {}
    for key, value in attributes.items():
        if value is None:
            continue
        if isinstance(value, bool | int | float | str):
            out[key] = value
        elif isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
            out[key] = list(value)
        else:
            out[key] = str(value)
    return out


def _is_interrupt(error: BaseException) -> bool:
    return type(error).__name__ in ("GraphInterrupt", "GraphBubbleUp", "Interrupt")


# -- the running export (one per process: the workbench's) ---------------------------------------
_active: Telemetry | None = None
_graph_handler_var: ContextVar[Any] = ContextVar("arbor_otlp_graph_spans", default=None)


def active() -> Telemetry | None:
    return _active


class GraphSpans(BaseCallbackHandler):
    """LangChain's callbacks for the graph run of a turn: its start and end become the turn's
    `invoke_agent` span (the graph's config metadata carries the turn's ids). LangChain makes one
    for each run while CALLBACK_SWITCH is set (`register_configure_hook`), which `start` sets."""

    def on_chain_start(self, serialized: Any, inputs: Any, *, run_id: UUID, parent_run_id: UUID | None = None,
                       metadata: dict | None = None, **kwargs: Any) -> None:
        telemetry = _active
        if telemetry is not None and parent_run_id is None and metadata and metadata.get("turn_id"):
            telemetry.graph_started(run_id, metadata)

    def on_chain_end(self, outputs: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        if _active is not None and parent_run_id is None:
            _active.graph_ended(run_id)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, parent_run_id: UUID | None = None,
                       **kwargs: Any) -> None:
        if _active is not None and parent_run_id is None:
            _active.graph_ended(run_id, error)


register_configure_hook(_graph_handler_var, inheritable=True, handle_class=GraphSpans, env_var=CALLBACK_SWITCH)


def start(exporter: SpanExporter | None = None) -> Telemetry | None:
    """Start the export when the environment asks for it (or with `exporter`); None when off."""
    global _active
    if exporter is None and not configured():
        return None
    exporter = exporter or OTLPSpanExporter()
    telemetry = Telemetry(exporter, max_queue=int(_env_number("OTEL_BSP_MAX_QUEUE_SIZE", 2048)),
                          batch=int(_env_number("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)),
                          delay_s=_env_number("OTEL_BSP_SCHEDULE_DELAY", 1000) / 1000)
    _active = telemetry
    os.environ[CALLBACK_SWITCH] = "true"
    log.info("exporting spans over OTLP to %s", os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
             or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))
    return telemetry


def stop(telemetry: Telemetry | None) -> None:
    global _active
    if telemetry is None:
        return
    if _active is telemetry:
        _active = None
        os.environ.pop(CALLBACK_SWITCH, None)
    telemetry.shutdown()
