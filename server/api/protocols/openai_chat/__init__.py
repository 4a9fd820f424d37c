"""OpenAI's Chat Completions: the whole answer (`reply.py`) and the streamed one (`stream.py`). Its
request body is the chat request the engine bridge renders, as sent
(server.api.engine_bridge.chat_request), which the other chat protocols translate theirs into."""
