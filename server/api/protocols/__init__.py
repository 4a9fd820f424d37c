"""The wire protocols the server speaks, one package each: its request body and its translation
into the chat or completion request the engine bridge runs (OpenAI chat's and completions' bodies
are those requests, as sent), and its answer, whole and streamed (a writer the stream driver,
server.api.streaming, drives)."""
