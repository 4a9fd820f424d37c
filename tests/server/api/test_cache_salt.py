"""Cache isolation (`cache_salt`, --cache-salt-per-key; docs/server.md, "Cache isolation").

Without a model: the request's namespace from its salt and the key it authenticated with,
several --api-key keys, the settings' checks. On the real server (embedded model): a second
salt's first request computes its whole prompt and reports `cached_tokens` 0, the same salt
reuses as today, a request without a salt and one with are isolated too; with tiers A,S,H
(the shared fixture), with D (and per-key salts), and through each API (chat, completions,
Responses, Messages)."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest
from starlette.requests import Request

from server.api.engine_bridge.chat_request import ChatCompletionRequest
from server.api.http.cache_fields import cache_namespace
from server.api.http.deps import api_key_error, api_key_id, api_keys, authenticated_key
from server.cli import settings_from_args
from server.engine.cache_namespace import request_namespace
from tests.server.conftest import start_server, stop_server

# ----------------------------------------------------------------------------- no model


def _http(**headers: str) -> Request:
    return Request({"type": "http", "method": "POST", "path": "/v1/chat/completions",
                    "headers": [(k.replace("_", "-").encode(), v.encode("latin-1")) for k, v in headers.items()]})


def _body(salt: str | None = None) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], "cache_salt": salt})


def test_several_api_keys_and_the_one_a_request_carries():
    assert api_keys("k1, k2,,k3 ") == ["k1", "k2", "k3"] and api_keys(None) == [] and api_keys("") == []
    assert authenticated_key("Bearer k2", "k1,k2") == "k2"
    assert authenticated_key(None, "k1,k2", x_api_key="k1") == "k1"
    assert authenticated_key("Bearer k3", "k1,k2") is None and authenticated_key("Basic k1", "k1") is None
    assert api_key_error("Bearer k2", "k1,k2") is None and api_key_error("Bearer k1", "k1") is None
    assert api_key_error("Bearer k1,k2", "k1,k2") is not None  # the list is no key
    assert api_key_error("Bearer x", "k1,k2").status == 401  # type: ignore[union-attr]
    assert api_key_id("k1") != api_key_id("k2") and "k1" not in api_key_id("k1")


def test_the_namespace_of_a_request():
    plain = settings_from_args([])
    assert cache_namespace(_body().cache_salt, _http(authorization="Bearer k1"), plain) is None
    assert cache_namespace(_body("s").cache_salt, None, plain) == request_namespace(salt="s", key_id=None)
    per_key = settings_from_args(["--api-key", "k1,k2", "--cache-salt-per-key"])
    k1, k2 = api_key_id("k1"), api_key_id("k2")
    ns = request_namespace
    assert cache_namespace(_body().cache_salt, _http(authorization="Bearer k1"), per_key) == ns(salt=None, key_id=k1)
    assert cache_namespace(_body().cache_salt, _http(x_api_key="k2"), per_key) == ns(salt=None, key_id=k2)
    assert cache_namespace(_body("s").cache_salt, _http(authorization="Bearer k2"), per_key) == ns(salt="s", key_id=k2)
    keys_only = settings_from_args(["--api-key", "k1,k2"])  # several keys, one shared cache
    assert cache_namespace(_body().cache_salt, _http(authorization="Bearer k1"), keys_only) is None


def test_a_salt_is_a_non_empty_string():
    for bad in ("", 7, "x" * 1025):
        with pytest.raises(ValueError, match="cache_salt"):
            _body(bad)  # type: ignore[arg-type]


def test_per_key_salting_needs_a_key():
    with pytest.raises(ValueError, match="--cache-salt-per-key"):
        settings_from_args(["--cache-salt-per-key"])
    with pytest.raises(ValueError, match="--api-key names no key"):
        settings_from_args(["--api-key", " , "])


# ----------------------------------------------------------------------------- real server


def _prompt(label: str) -> str:
    """A prompt of a few hundred tokens no other test sends, not even its first token (`label`:
    a word no other prompt starts with): a namespace holds the prompts of every test using it."""
    words = " ".join(f"{label}-{i} river stone {i * 7 % 13}" for i in range(30))
    return f"{label} {uuid.uuid4().hex}: {words}. Summary:"


def _complete(server, prompt: str, salt: str | None = None, key: str | None = None) -> dict:
    body = {"prompt": prompt, "max_tokens": 1, "temperature": 0}
    if salt is not None:
        body["cache_salt"] = salt
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    r = httpx.post(server.v1 + "/completions", json=body, headers=headers, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def _cached(reply: dict) -> int:
    return reply["usage"]["prompt_tokens_details"]["cached_tokens"]


def _isolated(reply: dict) -> None:
    """Nothing reused: the whole prompt computed, and `cached_tokens` 0."""
    assert _cached(reply) == 0, reply["arbor"]["cache"]
    assert reply["timings"]["prompt_n"] == reply["usage"]["prompt_tokens"]
    assert reply["arbor"]["cache"]["source"] == "none", reply["arbor"]["cache"]


@pytest.mark.model
def test_two_salts_never_share_and_one_salt_reuses(arbor_server):
    p = _prompt("Quartz")
    _isolated(_complete(arbor_server, p, "alice"))
    again = _complete(arbor_server, p, "alice")
    assert _cached(again) >= again["usage"]["prompt_tokens"] - 2  # same salt: reuse as today
    _isolated(_complete(arbor_server, p, "bob"))  # another salt: its first request computes it all
    _isolated(_complete(arbor_server, p))  # no salt vs salt: isolated too
    assert _cached(_complete(arbor_server, p, "bob")) > 0
    assert _cached(_complete(arbor_server, p)) > 0
    # the two slots hold bob's and the unsalted prompt: alice's went to host RAM (H), which
    # serves alice and no one else
    _isolated(_complete(arbor_server, p, "carol"))
    back = _complete(arbor_server, p, "alice")
    assert _cached(back) > 0 and back["arbor"]["cache"]["source"] in ("H", "A", "S"), back["arbor"]["cache"]


@pytest.mark.model
def test_a_running_request_of_another_salt_is_not_waited_for(arbor_server):
    """Two requests sent together with one long prompt and different salts: neither attaches
    the other's KV (the in-flight deferral and live copies compare namespaces)."""
    import concurrent.futures as cf

    p = _prompt("Vortex")
    with cf.ThreadPoolExecutor(2) as pool:
        replies = list(pool.map(lambda s: _complete(arbor_server, p, s), ["one", "two"]))
    for reply in replies:
        _isolated(reply)


@pytest.mark.model
def test_every_api_takes_a_salt(arbor_server):
    text = _prompt("Jigsaw")

    def chat(salt):
        r = httpx.post(arbor_server.v1 + "/chat/completions", timeout=300, json={
            "messages": [{"role": "user", "content": text}], "max_tokens": 1, "cache_salt": salt})
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    def responses(salt):
        r = httpx.post(arbor_server.v1 + "/responses", timeout=300, json={
            "input": text + " (responses)", "max_output_tokens": 1, "store": False, "cache_salt": salt})
        assert r.status_code == 200, r.text
        return r.json()["usage"]["input_tokens_details"]["cached_tokens"]

    def messages(salt):
        r = httpx.post(arbor_server.v1 + "/messages", timeout=300, json={
            "model": "m", "max_tokens": 1, "cache_salt": salt,
            "messages": [{"role": "user", "content": text + " (messages)"}]})
        assert r.status_code == 200, r.text
        return r.json()["usage"]["cache_read_input_tokens"]

    for send in (chat, responses, messages):  # one salt per API: their prompts share a prefix
        first, second = f"{send.__name__}-1", f"{send.__name__}-2"
        assert send(first) == 0, send.__name__
        assert send(first) > 0, send.__name__
        assert send(second) == 0, send.__name__
    r = httpx.post(arbor_server.v1 + "/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "x"}], "max_tokens": 1, "cache_salt": ""})
    assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt", r.text


def _wait_disk(server, headers: dict, at_least: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        d = httpx.get(server.base_url + "/cache/stats", headers=headers, timeout=60).json()["tiers"]["D"]
        if d["entries"] >= at_least:
            return
        time.sleep(0.2)
    raise AssertionError(f"the disk tier did not reach {at_least} entries: {d}")


@pytest.fixture(scope="module")
def keyed_disk_server(tmp_path_factory):
    """One slot, tiers A and D only (what a slot loses goes to disk), two keys, per-key salts."""
    tmp = tmp_path_factory.mktemp("salted-disk")
    server = start_server(tmp, "--parallel", "1", "--ctx-size", "2048", "--batch-size", "128",
                          "--cache-tiers", "A,D", "--cache-dir", str(tmp / "kv"), "--api-key", "k1,k2",
                          "--cache-salt-per-key")
    yield server
    stop_server(server)


@pytest.mark.model
def test_the_disk_tier_keeps_salts_apart(keyed_disk_server):
    s, h = keyed_disk_server, {"Authorization": "Bearer k1"}
    p = _prompt("Kayak")
    _isolated(_complete(s, p, "alice", key="k1"))
    before = httpx.get(s.base_url + "/cache/stats", headers=h, timeout=60).json()["tiers"]["D"]["entries"]
    _isolated(_complete(s, p, "bob", key="k1"))  # the slot's alice KV goes to disk
    _wait_disk(s, h, before + 1)
    back = _complete(s, p, "alice", key="k1")  # bob's goes to disk, alice's comes back from it
    assert _cached(back) > 0 and back["arbor"]["cache"]["source"] == "D", back["arbor"]["cache"]
    _wait_disk(s, h, before + 2)
    _isolated(_complete(s, p, key="k1"))  # no salt: neither alice's nor bob's
    bob = _complete(s, p, "bob", key="k1")
    assert _cached(bob) > 0 and bob["arbor"]["cache"]["source"] == "D", bob["arbor"]["cache"]


@pytest.mark.model
def test_per_key_salts_keep_keys_apart(keyed_disk_server):
    s = keyed_disk_server
    p = _prompt("Walrus")
    _isolated(_complete(s, p, key="k1"))
    assert _cached(_complete(s, p, key="k1")) > 0
    _isolated(_complete(s, p, key="k2"))  # another key: another cache
    _isolated(_complete(s, p, "x", key="k2"))  # a salt within a key: another one again
    assert _cached(_complete(s, p, key="k2")) > 0
