"""OpenTelemetry export of the workbench's spans over OTLP (otlp.py); off unless the standard
OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set."""
