"""/v1/embeddings on the embedded model (second context, forced mean pooling), and the 501
of a server that cannot embed, through the official openai client."""

from __future__ import annotations

import math

import httpx
import openai
import pytest

from tests.server.conftest import start_server, stop_server

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def embed_server(tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("embed"), "--embeddings", "--pooling", "mean",
                          "--embeddings-ctx", "64", "--parallel", "1", "--ctx-size", "1024")
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def client(embed_server):
    return openai.OpenAI(base_url=embed_server.v1, api_key="unused", max_retries=0, timeout=120)


def test_server_without_embeddings_says_why(arbor_server):
    bare = openai.OpenAI(base_url=arbor_server.v1, api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(openai.APIStatusError) as err:
        bare.embeddings.create(model="", input="hello")
    assert err.value.status_code == 501 and "--embeddings" in err.value.message


def test_vectors_are_normalised_and_deterministic(client, embed_server):
    texts = ["a cat sat on the mat", "stock markets fell sharply"]
    r = client.embeddings.create(model="", input=texts)  # base64 on the wire (the client's default)
    vecs = [d.embedding for d in r.data]
    assert [d.index for d in r.data] == [0, 1] and all(len(v) == 576 for v in vecs)
    assert all(abs(math.sqrt(sum(x * x for x in v)) - 1.0) < 1e-4 for v in vecs)
    assert vecs[0] != vecs[1]
    again = client.embeddings.create(model="", input=texts[0], encoding_format="float").data[0].embedding
    assert max(abs(a - b) for a, b in zip(again, vecs[0])) < 1e-5  # float and base64 agree; batch = single
    ids = httpx.post(embed_server.base_url + "/tokenize", json={"content": texts[0], "add_special": True}).json()
    by_ids = client.embeddings.create(model="", input=[ids["tokens"]], encoding_format="float").data[0].embedding
    assert max(abs(a - b) for a, b in zip(by_ids, vecs[0])) < 1e-5
    assert r.usage.prompt_tokens == r.usage.total_tokens > 0


def test_embedding_leaves_generation_kv_alone(client, embed_server):
    chat = openai.OpenAI(base_url=embed_server.v1, api_key="unused", max_retries=0, timeout=120)
    kw = dict(model="", messages=[{"role": "user", "content": "Name a colour."}], max_tokens=6, temperature=0)
    first = chat.chat.completions.create(**kw)
    client.embeddings.create(model="", input=["one input", "another input"])
    second = chat.chat.completions.create(**kw)
    # the slot's KV survived: the prompt is reused from it, and the answer is unchanged
    assert second.model_extra["arbor"]["cache"]["source"] == "A"
    assert second.usage.prompt_tokens_details.cached_tokens == second.usage.prompt_tokens - 1
    assert second.choices[0].message.content == first.choices[0].message.content
    slot = httpx.get(embed_server.base_url + "/slots").json()[0]
    assert slot["kv_pos_max"] == slot["n_past"] - 1


@pytest.mark.parametrize("kwargs,param", [
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": "word " * 100}, "input"),   # over --embeddings-ctx 64
    ({"input": [[10**7]]}, "input"),
    ({"input": "hi", "dimensions": 8}, "dimensions"),
])
def test_bad_inputs_are_400(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as err:
        client.embeddings.create(model="", encoding_format="float", **kwargs)
    assert err.value.body["param"] == param
