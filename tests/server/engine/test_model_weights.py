"""model_weights: tensor types read with ggml's GGUF parser, and which tensors are matmul weights."""

from __future__ import annotations

import pytest

from tests.server.engine.gguf_files import write_gguf

pytest.importorskip("llama_cpp")

from server.engine.model_weights import ModelFileError, matmul_weights, read_tensor_types, type_counts


def test_types_are_read_as_ggml_names_them(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", {"token_embd.weight": "Q6_K", "blk.0.attn_q.weight": "Q4_K",
                                            "blk.0.attn_norm.weight": "F32", "output.weight": "Q8_0"})
    assert [(t.name, t.type) for t in read_tensor_types(path)] == [
        ("token_embd.weight", "Q6_K"), ("blk.0.attn_q.weight", "Q4_K"), ("blk.0.attn_norm.weight", "F32"),
        ("output.weight", "Q8_0")]


def test_norms_and_the_token_embedding_are_not_matmul_weights(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", {"token_embd.weight": "Q6_K", "blk.0.attn_q.weight": "Q4_K",
                                            "blk.0.ffn_up.weight": "Q4_K", "blk.0.attn_norm.weight": "F32",
                                            "output.weight": "Q8_0"})
    weights = matmul_weights(read_tensor_types(path))
    assert [w.name for w in weights] == ["blk.0.attn_q.weight", "blk.0.ffn_up.weight", "output.weight"]
    assert type_counts(weights) == {"Q4_K": 2, "Q8_0": 1}


def test_tied_embeddings_make_the_token_embedding_the_output_matmul(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", {"token_embd.weight": "Q6_K", "blk.0.attn_q.weight": "Q4_0"})
    assert type_counts(matmul_weights(read_tensor_types(path))) == {"Q6_K": 1, "Q4_0": 1}


def test_expert_weights_are_recognised(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", {"blk.0.ffn_up_exps.weight": "BF16", "blk.0.attn_q.weight": "BF16"})
    assert [w.is_expert for w in read_tensor_types(path)] == [True, False]


def test_a_file_ggml_cannot_parse_is_named(tmp_path):
    bad = tmp_path / "not-a-model.gguf"
    bad.write_bytes(b"GGUF but not really")
    with pytest.raises(ModelFileError, match="not-a-model.gguf"):
        read_tensor_types(bad)
