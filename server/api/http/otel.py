"""One OpenTelemetry span per generation request, exported over OTLP: off unless the standard
OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set and the OpenTelemetry
SDK is installed (it is a dependency of the project; a server image without it runs without
spans, saying so once).

The request's W3C `traceparent` header (the workbench sends its model call's: app/agent/
chat_model.py) makes the span a child of the caller's, so a turn's trace holds the server's
side of each model call. The span (kind SERVER, named `chat <model>`; `text_completion` for the
completion endpoints) covers the request until its last byte, streamed or not, and carries the
GenAI attributes and Arbor's cache and drafting figures from the request's end (`annotate`,
called by engine_bridge/generation.py): gen_ai.usage.input_tokens / output_tokens /
cache_read.input_tokens, gen_ai.response.finish_reasons, arbor.cache.source, reused_tokens,
restored_bytes, restore_ms, plan, arbor.speculative.draft_tokens / accepted_tokens,
arbor.prompt_ms, arbor.predicted_ms, and the HTTP status. Spans go through the SDK's batch
processor: a bounded queue and a thread of its own, so an unreachable collector costs a request
nothing. OTEL_SERVICE_NAME names the service (default `arbor-server`).
"""

from __future__ import annotations

import logging
import os
from contextvars import ContextVar
from typing import Any

from server.engine.sequence import Finished

log = logging.getLogger(__name__)

SERVICE_NAME = "arbor-server"
#: the generation endpoints (after UnprefixedAliases) and the GenAI operation each is
OPERATIONS = {"/v1/chat/completions": "chat", "/v1/responses": "chat", "/v1/messages": "chat",
              "/v1/completions": "text_completion", "/completion": "text_completion",
              "/completions": "text_completion"}

_current: ContextVar[Any] = ContextVar("arbor_request_span", default=None)


def configured() -> bool:
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() in ("none", ""):
        return False
    return bool(os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def current_span() -> Any:
    """The span of the request being handled (None without export)."""
    return _current.get()


def annotate(span: Any, fin: Finished) -> None:
    """What the engine reports at the end of a request, on its span."""
    if span is None:
        return
    attributes = {
        "gen_ai.usage.input_tokens": fin.prompt_tokens, "gen_ai.usage.output_tokens": fin.completion_tokens,
        "gen_ai.usage.cache_read.input_tokens": fin.cached_tokens,
        "gen_ai.response.finish_reasons": [fin.finish_reason],
        "arbor.cache.source": fin.cache.source, "arbor.cache.reused_tokens": fin.cache.reused_tokens,
        "arbor.cache.restored_bytes": fin.cache.restored_bytes, "arbor.cache.restore_ms": fin.cache.restore_ms,
        "arbor.cache.plan": fin.cache.plan, "arbor.prompt_ms": fin.prompt_ms, "arbor.predicted_ms": fin.predicted_ms,
        "arbor.speculative.draft_tokens": fin.draft_n, "arbor.speculative.accepted_tokens": fin.draft_n_accepted,
    }
    span.set_attributes(attributes)
    if fin.finish_reason == "error":
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, (fin.error or "generation failed")[:500]))
        span.set_attribute("error.type", "engine_error")


class RequestSpans:
    """ASGI middleware: a span around each generation request, its parent from `traceparent`."""

    def __init__(self, app: Any, tracer: Any, propagator: Any) -> None:
        self.app, self.tracer, self.propagator = app, tracer, propagator

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        operation = OPERATIONS.get(scope.get("path", "")) if scope["type"] == "http" else None
        if operation is None or scope.get("method") != "POST":
            return await self.app(scope, receive, send)
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind, Status, StatusCode

        carrier = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope.get("headers", ())}
        parent = self.propagator.extract(carrier)
        state = getattr(getattr(scope.get("app"), "state", None), "arbor", None)
        model = getattr(state, "model_name", None) or "model"
        span = self.tracer.start_span(f"{operation} {model}", context=parent, kind=SpanKind.SERVER, attributes={
            "gen_ai.operation.name": operation, "gen_ai.provider.name": "arbor", "gen_ai.request.model": model,
            "http.request.method": "POST", "url.path": scope.get("path", ""), "arbor.traced": True})
        token = _current.set(span)

        async def send_and_note(message: dict) -> None:
            if message.get("type") == "http.response.start":
                status = int(message.get("status", 0))
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    span.set_status(Status(StatusCode.ERROR))
            await send(message)

        try:
            with trace.use_span(span, end_on_exit=False):
                await self.app(scope, receive, send_and_note)
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, str(exc)[:500]))
            raise
        finally:
            _current.reset(token)
            span.end()


def install(app: Any) -> bool:
    """Add RequestSpans to `app` when the environment asks for export and the SDK is there."""
    if not configured():
        return False
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError as exc:
        log.warning("OTEL_EXPORTER_OTLP_ENDPOINT is set but the OpenTelemetry SDK is not installed (%s): "
                    "no request spans", exc)
        return False
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or SERVICE_NAME})
    provider = TracerProvider(resource=resource)  # shuts down (flushes) at exit
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    app.add_middleware(RequestSpans, tracer=provider.get_tracer("arbor.server"),
                       propagator=TraceContextTextMapPropagator())
    log.info("request spans go over OTLP to %s", os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
             or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))
    return True
