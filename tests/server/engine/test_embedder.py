"""The embeddings context refuses a model without pooling unless one is forced."""

from __future__ import annotations

import pytest

from tests.cores import model_threads
from tests.server.conftest import embedded_model_available

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def runtime():
    if why := embedded_model_available():
        pytest.skip(why)
    from server.engine.llama_runtime import LlamaRuntime, RuntimeConfig
    from server.model_file import embedded_model_path

    rt = LlamaRuntime(RuntimeConfig(model_path=embedded_model_path(), n_ctx=256, n_batch=32, n_seq_max=1,
                                    n_threads=model_threads(), n_threads_batch=model_threads()))
    yield rt
    rt.close()


def test_generative_model_without_forced_pooling_is_refused(runtime):
    from server.engine.embedder import Embedder, EmbeddingsUnavailable

    with pytest.raises(EmbeddingsUnavailable, match="pooling is 'none'.*--pooling"):
        Embedder(runtime.model, n_ctx=32, n_threads=model_threads())


@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_forced_pooling_embeds(runtime, pooling):
    from server.engine.embedder import Embedder

    e = Embedder(runtime.model, n_ctx=32, n_threads=model_threads(), pooling=pooling)
    try:
        toks = runtime.tokenize("hello world", add_special=True, parse_special=True)
        assert e.pooling == pooling and len(e.embed(toks)) == 576
        assert e.embed(toks) == e.embed(toks)
        with pytest.raises(ValueError):
            e.embed(list(range(1, 40)))
    finally:
        e.close()
