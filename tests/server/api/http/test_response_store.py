"""The Responses API's stored responses: bounded by count and bytes, oldest first, chains kept
fresh (no model)."""

from __future__ import annotations

from server.api.http.response_store import ResponseStore, StoredResponse


def _stored(rid: str, previous: str | None = None, size_text: str = "") -> StoredResponse:
    return StoredResponse(rid, previous or rid, previous, [{"role": "user", "content": size_text}],
                          {"id": rid, "output": []})


def test_store_evicts_oldest_first_by_count():
    store = ResponseStore(max_responses=2, max_bytes=1 << 20)
    for rid in ("a", "b", "c"):
        assert store.put(_stored(rid))
    assert store.get("a") is None and store.get("b") and store.get("c")
    assert store.stats()["evicted"] == 1 and len(store) == 2


def test_store_evicts_oldest_first_by_bytes_and_refuses_what_never_fits():
    one = _stored("a", size_text="x" * 100).size
    store = ResponseStore(max_responses=100, max_bytes=2 * one + 10)
    for rid in ("a", "b", "c"):
        assert store.put(_stored(rid, size_text="x" * 100))
    assert store.get("a") is None and store.get("b") and store.get("c")
    assert store.bytes <= store.max_bytes
    assert not store.put(_stored("big", size_text="x" * 10_000))
    assert store.stats()["refused"] == 1 and store.get("b")


def test_store_chain_is_kept_fresh_and_breaks_without_its_start():
    store = ResponseStore(max_responses=3, max_bytes=1 << 20)
    store.put(_stored("r1"))
    store.put(_stored("r2", previous="r1"))
    store.put(_stored("x"))
    assert [r.id for r in store.chain("r2") or []] == ["r1", "r2"]  # now the newest: x is evicted next
    store.put(_stored("y"))
    assert store.get("x") is None and store.chain("r2") is not None
    assert store.delete("r1") and store.chain("r2") is None
    assert not store.delete("r1")
    assert ResponseStore(0, 1 << 20).put(_stored("z")) is False
