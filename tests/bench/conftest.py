"""Fixtures of the benchmark scripts' tests."""

from pathlib import Path

import pytest

from harness.models.synth_model import ModelShape, write_model

TINY = ModelShape("llama", n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, head_dim=16)


@pytest.fixture
def tiny_llama(tmp_path) -> Path:
    """A tiny random-weight llama GGUF (q8_0, the embedded tokenizer): the real engine at almost no compute."""
    return write_model(TINY, "q8_0", tmp_path / "tiny.gguf", seed=1, name="tiny-llama")
