"""OpenAI's Chat Completions: the request body (`request.py`, also what the other chat protocols
translate into), the whole answer (`reply.py`) and the streamed one (`stream.py`)."""
