"""llama-server's paths without /v1 answer like their /v1 routes (real server, openai client)."""

from __future__ import annotations

import httpx
import openai
import pytest

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def bare(arbor_server):
    """A client whose base URL has no /v1, as llama-server users often configure it."""
    return openai.OpenAI(base_url=arbor_server.base_url, api_key="unused", max_retries=0, timeout=120)


def test_models_without_v1(bare, arbor_server):
    assert [m.id for m in bare.models.list().data] == [m["id"] for m in
                                                       httpx.get(arbor_server.v1 + "/models").json()["data"]]


def test_chat_and_completions_without_v1_match_v1(bare, arbor_server):
    v1 = openai.OpenAI(base_url=arbor_server.v1, api_key="unused", max_retries=0, timeout=120)
    # Each prompt is sent once first, so both compared answers reuse the same cached prefix
    # (a cold and a warm prefill may differ in the last float bits and flip a greedy near-tie).
    kw = dict(model="", messages=[{"role": "user", "content": "Say hi."}], max_tokens=6, temperature=0)
    v1.chat.completions.create(**kw)
    assert bare.chat.completions.create(**kw).choices[0].message.content == \
        v1.chat.completions.create(**kw).choices[0].message.content
    kw = dict(model="", prompt="The sky is", max_tokens=5, temperature=0)
    v1.completions.create(**kw)
    assert bare.completions.create(**kw).choices[0].text == v1.completions.create(**kw).choices[0].text


def test_unknown_path_is_still_404(arbor_server):
    r = httpx.post(arbor_server.base_url + "/chat/completion", json={})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
