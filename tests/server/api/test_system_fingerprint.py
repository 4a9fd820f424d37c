"""`system_fingerprint`: the same on every answer of one server, and named after build + model."""

from __future__ import annotations

import httpx
import openai
import pytest

from server.build_info import system_fingerprint
from server.model_file import embedded_model_path

pytestmark = pytest.mark.model


def test_fingerprint_on_every_answer_kind(arbor_server):
    client = openai.OpenAI(base_url=arbor_server.v1, api_key="unused", max_retries=0, timeout=120)
    expected = system_fingerprint(embedded_model_path())
    msgs = [{"role": "user", "content": "Hi"}]
    assert client.chat.completions.create(model="", messages=msgs, max_tokens=2).system_fingerprint == expected
    chunks = list(client.chat.completions.create(model="", messages=msgs, max_tokens=2, stream=True,
                                                 stream_options={"include_usage": True}))
    assert {c.system_fingerprint for c in chunks} == {expected}
    assert client.completions.create(model="", prompt="Hi", max_tokens=2).system_fingerprint == expected
    assert {c.system_fingerprint for c in client.completions.create(model="", prompt="Hi", max_tokens=2,
                                                                    stream=True)} == {expected}
    assert httpx.get(arbor_server.base_url + "/props").json()["system_fingerprint"] == expected


def test_fingerprint_follows_the_model_file(tmp_path):
    copy = tmp_path / "model.gguf"
    data = bytearray(embedded_model_path().read_bytes())
    assert system_fingerprint(embedded_model_path()) == system_fingerprint(embedded_model_path())
    data[-1] ^= 1  # another quantisation or file: another fingerprint
    copy.write_bytes(data)
    assert system_fingerprint(copy) != system_fingerprint(embedded_model_path())
    assert system_fingerprint(copy).startswith("fp_")
