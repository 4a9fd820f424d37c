"""The workbench's JSON + SSE HTTP API (mounted under /api)."""
