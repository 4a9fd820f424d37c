"""The wire protocols the server speaks, one package each: its request body, its translation into
the chat or completion request the engine bridge runs, and its answer, whole and streamed (a
writer the stream driver, server.api.streaming, drives)."""
