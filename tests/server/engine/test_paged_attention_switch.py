"""server.engine.paged_attention.configure: which --paged-attn mode does what, with llama.cpp's
answer simulated (the real answers are checked in test_paged_attention_real.py)."""

from __future__ import annotations

import pytest

from server.engine import paged_attention as pa


def simulate(monkeypatch, code: int | None):
    """llama_set_paged_attn answering `code`; None: the build has no such symbol."""
    calls = []

    def set_paged_attn(ctx, page_size):
        calls.append(page_size)
        return code

    monkeypatch.setattr(pa, "_set_paged_attn", lambda: None if code is None else set_paged_attn)
    return calls


def test_auto_turns_it_on_where_llama_cpp_accepts(monkeypatch):
    calls = simulate(monkeypatch, 0)
    status = pa.configure(object(), "auto", 32)
    assert status == pa.PagedAttentionStatus(True, 32) and status.enabled and calls == [32]


def test_auto_leaves_offloaded_models_unpaged_without_asking(monkeypatch):
    calls = simulate(monkeypatch, 0)
    status = pa.configure(object(), "auto", 16, offloaded=True)
    assert not status.enabled and "--paged-attn on" in status.note and calls == []


def test_on_with_offloaded_layers_asks_llama_cpp(monkeypatch):
    calls = simulate(monkeypatch, 0)
    assert pa.configure(object(), "on", 16, offloaded=True).enabled and calls == [16]
    simulate(monkeypatch, -3)
    with pytest.raises(pa.PagedAttentionUnavailable, match="without a paged-attention kernel"):
        pa.configure(object(), "on", 16, offloaded=True)


@pytest.mark.parametrize(("code", "words"), [(-1, "flash attention is off"), (-2, "not one plain unified KV"),
                                             (-4, "larger than the KV cache"), (-5, "more than 262,144 pages"),
                                             (-9, "returned -9")])
def test_auto_says_why_it_stays_off(monkeypatch, code, words):
    simulate(monkeypatch, code)
    status = pa.configure(object(), "auto", 16)
    assert not status.enabled and status.compiled_in and words in status.note


def test_an_unpatched_build(monkeypatch):
    simulate(monkeypatch, None)
    assert not pa.compiled_in()
    status = pa.configure(object(), "auto", 16)
    assert (status.compiled_in, status.enabled) == (False, False)
    assert "not built from Arbor's patched source" in status.note
    with pytest.raises(pa.PagedAttentionUnavailable, match="patched source"):
        pa.configure(object(), "on", 16)


def test_off_never_asks(monkeypatch):
    calls = simulate(monkeypatch, 0)
    assert not pa.configure(object(), "off", 16).enabled and calls == []
