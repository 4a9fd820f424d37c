"""/v1/embeddings without a model: the input count limit (--max-embeddings-inputs) and the
stop at a client that went away (the route over a fake model whose embedder counts its calls)."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest
from starlette.requests import Request

from server.api.http.errors import APIError
from server.api.routes.embeddings import EmbeddingRequest, embeddings, raw_inputs
from server.settings import ServerSettings


@pytest.mark.parametrize("given,count", [("one text", 1), ([1, 2, 3], 1), (["a", "b"], 2), ([[1], [2], [3]], 3)])
def test_inputs_up_to_the_limit_pass(given, count):
    assert len(raw_inputs(EmbeddingRequest(input=given), 3)) == count


def test_more_inputs_than_the_limit_name_the_flag():
    with pytest.raises(APIError) as info:
        raw_inputs(EmbeddingRequest(input=["x"] * 4), 3)
    err = info.value
    assert err.status == 400 and err.param == "input" and err.code == "too_many_inputs"
    assert "4 inputs" in err.message and "--max-embeddings-inputs" in err.message
    with pytest.raises(APIError, match="at least one"):
        raw_inputs(EmbeddingRequest(input=[]), 3)


class _Embedder:
    n_ctx, n_embd = 64, 2

    def __init__(self, after_first: threading.Event):
        self.calls = 0
        self.after_first = after_first

    def embed(self, tokens):
        self.calls += 1
        self.after_first.set()
        return [1.0, 0.0]


def test_a_client_that_goes_away_stops_the_work():
    first = threading.Event()
    embedder = _Embedder(first)
    model = SimpleNamespace(
        embedder=embedder, model_name="m", embeddings_note=None,
        runtime=SimpleNamespace(tokenize=lambda text, **_: [1, 2], info=SimpleNamespace(n_vocab=100)),
        engine=SimpleNamespace(run_exclusive=lambda fn: fn()))
    state = SimpleNamespace(settings=ServerSettings(max_embeddings_inputs=50))

    async def receive():  # the body was read; then the client hangs up once the first input is embedded
        while not first.is_set():
            await asyncio.sleep(0.001)
        return {"type": "http.disconnect"}

    request = Request({"type": "http", "method": "POST", "path": "/v1/embeddings", "headers": []}, receive)
    answer = asyncio.run(embeddings(EmbeddingRequest(input=["text"] * 50), request, state, model))
    assert answer.status_code == 499
    assert embedder.calls < 5  # not the 50 asked for

    async def stays():
        await asyncio.Event().wait()

    done = asyncio.run(embeddings(EmbeddingRequest(input=["text"] * 5), Request(
        {"type": "http", "method": "POST", "path": "/v1/embeddings", "headers": []}, stays), state, model))
    assert len(done["data"]) == 5
