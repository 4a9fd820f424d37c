"""OpenAI's (legacy) text completions: the whole answer (`reply.py`) and the streamed one
(`stream.py`). Its request body is the completion request the engine bridge runs, as sent
(server.api.engine_bridge.completion_request)."""
