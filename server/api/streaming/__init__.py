"""Streamed answers: the server-sent-event frame encodings (sse) and the one stream driver every
protocol's writer plugs into (driver)."""
