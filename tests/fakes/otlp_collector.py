"""A real OTLP/HTTP trace receiver for tests: `POST /v1/traces` with an OTLP protobuf body
(`ExportTraceServiceRequest`, from the `opentelemetry-proto` package the exporter itself uses),
gzip or not, answered with an `ExportTraceServiceResponse`, as an OpenTelemetry Collector's
otlphttp receiver does. What it received is kept decoded in `spans` (one dict per span, ids in
hex, attributes as plain values, the resource's service.name as `service`).

Usage::

    with OtlpCollector() as collector:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = collector.endpoint
        ...
        spans = collector.wait_for(lambda spans: len(spans) >= 3)
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, kind) if kind else None


class OtlpCollector:
    def __init__(self) -> None:
        self.spans: list[dict] = []
        self.requests = 0
        self.lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces" or "protobuf" not in (self.headers.get("Content-Type") or ""):
                    self.send_response(404)
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                collector._keep(request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        """The base URL for OTEL_EXPORTER_OTLP_ENDPOINT (the exporter appends /v1/traces)."""
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def _keep(self, request: ExportTraceServiceRequest) -> None:
        spans = []
        for resource_spans in request.resource_spans:
            resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append({
                        "service": resource.get("service.name"), "name": span.name, "kind": span.kind,
                        "trace_id": span.trace_id.hex(), "span_id": span.span_id.hex(),
                        "parent_span_id": span.parent_span_id.hex() or None,
                        "start_ns": span.start_time_unix_nano, "end_ns": span.end_time_unix_nano,
                        "status": span.status.code, "scope": scope_spans.scope.name,
                        "attributes": {kv.key: _value(kv.value) for kv in span.attributes}})
        with self.lock:
            self.requests += 1
            self.spans.extend(spans)

    def wait_for(self, test: Callable[[list[dict]], bool], timeout_s: float = 30.0) -> list[dict]:
        deadline = time.monotonic() + timeout_s
        while True:
            with self.lock:
                spans = list(self.spans)
            if test(spans):
                return spans
            if time.monotonic() > deadline:
                raise AssertionError(f"the collector's {len(spans)} span(s) never passed the test: "
                                     f"{[(s['service'], s['name']) for s in spans]}")
            time.sleep(0.05)

    def __enter__(self) -> OtlpCollector:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
