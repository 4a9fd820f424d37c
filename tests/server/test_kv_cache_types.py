"""--cache-type-k / --cache-type-v (issue 32, item 5) without a model: the flags, the
combinations refused at start with the reason, paged attention's refusal where its kernel
reads f16 only, and the state parser's refusal of a V it cannot split by token."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from pydantic import ValidationError

from server.cli import settings_from_args
from server.engine.kv_types import GGML_TYPE_IDS, KV_CACHE_TYPES, QUANTIZED_TYPE_IDS, is_quantized
from server.settings import ServerSettings


def test_the_types_are_llama_servers_and_f16_by_default():
    assert KV_CACHE_TYPES == ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
    s = settings_from_args([])
    assert (s.cache_type_k, s.cache_type_v) == ("f16", "f16")
    s = settings_from_args(["-ctk", "q8_0", "-ctv", "q4_0"])
    assert (s.cache_type_k, s.cache_type_v) == ("q8_0", "q4_0")
    s = settings_from_args(["--cache-type-k", "bf16", "--cache-type-v", "q5_1"])
    assert (s.cache_type_k, s.cache_type_v) == ("bf16", "q5_1")


def test_the_environment_sets_them(monkeypatch):
    monkeypatch.setenv("ARBOR_SERVER_CACHE_TYPE_K", "q8_0")
    monkeypatch.setenv("ARBOR_SERVER_CACHE_TYPE_V", "q8_0")
    assert (ServerSettings().cache_type_k, ServerSettings().cache_type_v) == ("q8_0", "q8_0")


def test_an_unknown_type_is_refused_with_the_choices(capsys):
    with pytest.raises(SystemExit):
        settings_from_args(["--cache-type-k", "q3_k"])
    err = capsys.readouterr().err
    assert "--cache-type-k" in err and "q8_0" in err
    with pytest.raises(ValidationError, match="cache_type_v"):
        ServerSettings(cache_type_v="f64")


def test_a_quantized_v_needs_flash_attention():
    for v in ("q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"):
        with pytest.raises(ValidationError, match=f"--cache-type-v {v} needs flash attention.*--flash-attn off"):
            settings_from_args(["--cache-type-v", v, "--flash-attn", "off"])
        assert settings_from_args(["--cache-type-v", v]).flash_attn == "auto"  # llama.cpp turns it on
    # a quantized K and an unquantized V (transposed without flash attention) are fine
    for v in ("f16", "bf16", "f32"):
        s = settings_from_args(["--cache-type-k", "q8_0", "--cache-type-v", v, "--flash-attn", "off"])
        assert (s.cache_type_k, s.cache_type_v, s.flash_attn) == ("q8_0", v, "off")


def test_quantized_means_what_ggml_means():
    assert [t for t in KV_CACHE_TYPES if not is_quantized(t)] == ["f32", "f16", "bf16"]
    assert QUANTIZED_TYPE_IDS == {GGML_TYPE_IDS[t] for t in KV_CACHE_TYPES if is_quantized(t)}
    llama_cpp = pytest.importorskip("llama_cpp")
    for name, type_id in GGML_TYPE_IDS.items():
        const = getattr(llama_cpp, f"GGML_TYPE_{name.upper()}", None)
        assert const is None or const == type_id, name  # llama-cpp-python names no BF16 (ggml.h: 30)


def test_paged_attention_on_an_accelerator_refuses_a_kv_type_its_kernel_cannot_read():
    pytest.importorskip("llama_cpp")
    from server.engine.paged_attention import PagedAttentionUnavailable, configure

    with pytest.raises(PagedAttentionUnavailable, match="f16 K and V only.*--cache-type-k q8_0"):
        configure(None, "on", 16, offloaded=True, kv_types=("q8_0", "q8_0"))
    with pytest.raises(PagedAttentionUnavailable, match="--cache-type-v bf16"):
        configure(None, "on", 16, offloaded=True, kv_types=("f16", "bf16"))
    status = configure(None, "auto", 16, offloaded=True, kv_types=("q8_0", "q8_0"))
    assert not status.enabled and "offloaded" in (status.note or "")
    assert not configure(None, "off", 16, offloaded=True, kv_types=("q8_0", "q8_0")).enabled


def _state(v_trans: bool, v_type: int, row: int) -> bytes:
    """A one-layer, two-cell sequence state as llama.cpp writes it (kv_format's docstring)."""
    n = 2
    out = struct.pack("<IiII", 0xAF143CD8, 0, 1, n)
    out += np.array([(0, 1, 0), (1, 1, 0)], dtype=[("p", "<i4"), ("n", "<u4"), ("s", "<i4")]).tobytes()
    out += struct.pack("<II", int(v_trans), 1)
    out += struct.pack("<iQ", GGML_TYPE_IDS["q8_0"], 34) + bytes(34 * n)  # K: one q8_0 block per cell
    if v_trans:
        out += struct.pack("<iII", v_type, row, 1) + bytes(row * n)
    else:
        out += struct.pack("<iQ", v_type, row) + bytes(row * n)
    return out


def test_the_state_parser_splits_quantized_rows_and_refuses_a_transposed_quantized_v():
    from server.cache.kv_format import KVFormatError, parse_seq_state, state_blob

    seg = parse_seq_state(_state(False, GGML_TYPE_IDS["q8_0"], 34))
    assert seg.n_tokens == 2 and seg.layout.bytes_per_token == 68
    a, b = seg.split(1)
    assert bytes(state_blob([a, b])) == _state(False, GGML_TYPE_IDS["q8_0"], 34)
    assert parse_seq_state(_state(True, GGML_TYPE_IDS["f16"], 2)).layout.v_trans  # transposed f16 V: fine
    with pytest.raises(KVFormatError, match="transposed V of quantized"):
        parse_seq_state(_state(True, GGML_TYPE_IDS["q8_0"], 34))
