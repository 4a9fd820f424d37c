"""Paged attention on the real engine (embedded model): the same KV operations on a paged and an
unpaged context predict the same tokens (teacher-forced top-1 agreement), with other sequences'
cells interleaved, a prefix shared by seq_cp, cells freed and reused, a sequence restored from
its saved state; and the switch refuses what it cannot run, with the reason."""

from __future__ import annotations

import dataclasses

import pytest

from tests.cores import model_threads
from tests.server.conftest import embedded_model_available

pytestmark = pytest.mark.model


def runtime(paged: str, **kw):
    why = embedded_model_available()
    if why:
        pytest.skip(why)
    from server.engine.llama_runtime import LlamaRuntime, RuntimeConfig
    from server.model_file import embedded_model_path

    cfg = dict(n_ctx=4096, n_batch=256, n_seq_max=6, n_threads=model_threads(), n_threads_batch=model_threads(),
               paged_attn=paged, page_size=16)
    cfg.update(kw)
    return LlamaRuntime(RuntimeConfig(embedded_model_path(), **cfg))


def test_paged_predicts_what_unpaged_predicts():
    """bench.paged_agreement's script: shared prefix, interleaved idle cells, freed and reused cells,
    a restored sequence, three sequences decoding in one batch."""
    why = embedded_model_available()
    if why:
        pytest.skip(why)
    from bench.paged_agreement import agreement
    from server.model_file import embedded_model_path

    result = agreement(embedded_model_path(), page_size=16)
    assert result["predictions"] > 700
    assert result["agreement"] >= 0.995, result


def test_on_without_flash_attention_is_refused_with_the_reason():
    from server.engine.paged_attention import PagedAttentionUnavailable

    with pytest.raises(PagedAttentionUnavailable, match="flash attention is off"):
        runtime("on", flash_attn=False)


def test_auto_without_flash_attention_runs_unpaged_and_says_why():
    rt = runtime("auto", flash_attn=False)
    try:
        assert not rt.paged_attn.enabled and rt.paged_attn.compiled_in
        assert "flash attention is off" in rt.paged_attn.note
    finally:
        rt.close()


def test_page_larger_than_the_kv_is_refused():
    from server.engine.paged_attention import PagedAttentionUnavailable

    with pytest.raises(PagedAttentionUnavailable, match="larger than the KV cache"):
        runtime("on", n_ctx=512, page_size=4096)


def test_more_pages_than_a_table_entry_indexes_are_refused(tmp_path):
    """Exact page lengths: a page-table entry keeps the page's index in 18 bits beside its flag and cut, so a KV of more
    than 262,144 pages is refused with the reason (a tiny random-weight model: 262,400 cells of 128 bytes); pages of 2
    cells over the same KV are taken."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (run scripts/setup.sh)")
    from harness.models.synth_model import ModelShape, write_model
    from server.engine import paged_attention
    from server.engine.llama_runtime import LlamaRuntime, RuntimeConfig
    from server.engine.paged_attention import PagedAttentionUnavailable

    if not paged_attention.compiled_in():
        pytest.skip("llama-cpp-python was not built from Arbor's patched source")
    shape = ModelShape("llama", n_layer=1, n_embd=64, n_head=2, n_head_kv=1, n_ff=128, head_dim=32,
                       context_length=4096)
    model = write_model(shape, "f32", tmp_path / "tiny.gguf", seed=3)
    cfg = RuntimeConfig(model, n_ctx=(1 << 18) + 256, n_batch=32, n_seq_max=1, n_threads=1, n_threads_batch=1,
                        paged_attn="on", page_size=1)
    with pytest.raises(PagedAttentionUnavailable, match="more than 262,144 pages"):
        LlamaRuntime(cfg)
    rt = LlamaRuntime(dataclasses.replace(cfg, page_size=2))
    try:
        assert rt.paged_attn.enabled and rt.paged_attn.page_size == 2
    finally:
        rt.close()
