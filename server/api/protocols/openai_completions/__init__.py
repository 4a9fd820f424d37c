"""OpenAI's (legacy) text completions: the request body (`request.py`), the whole answer
(`reply.py`) and the streamed one (`stream.py`)."""
