"""harness/models/synth_model.py: the GGUF it writes has the planned tensors and the embedded tokenizer,
and llama.cpp loads it, tokenizes like the embedded model and decodes with finite logits."""

import ctypes
import functools
import importlib.util
from dataclasses import replace

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader

from harness.models.synth_model import (
    SHAPES,
    TOKENIZER_VOCAB,
    ModelShape,
    embedded_tokenizer_path,
    main,
    planned_bytes,
    tensor_plan,
    write_model,
)

TINY = {
    "llama": ModelShape("llama", n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, head_dim=16),
    # qwen3 with head_dim * n_head != n_embd, as in the real Qwen3-0.6B (16 x 128 vs 1024)
    "qwen3": ModelShape("qwen3", n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, head_dim=32,
                        rms_eps=1e-6, rope_freq_base=1e6),
}


@functools.lru_cache(maxsize=1)
def source_tokenizer() -> dict:
    """The embedded model's tokenizer fields, read once (GGUFReader is slow on 100k strings)."""
    reader = GGUFReader(str(embedded_tokenizer_path()))
    return {k: f.contents() for k, f in reader.fields.items()
            if k.startswith("tokenizer.") and k != "tokenizer.chat_template"}


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth")
    return {arch: write_model(shape, "q8_0", out / f"{arch}.gguf", seed=1, name=f"tiny-{arch}")
            for arch, shape in TINY.items()}


@pytest.mark.parametrize("arch", sorted(TINY))
def test_file_has_planned_tensors_and_embedded_tokenizer(tiny_models, arch):
    reader = GGUFReader(str(tiny_models[arch]))
    fields = {k: f.contents() for k, f in reader.fields.items() if k != "tokenizer.chat_template"}
    shape = TINY[arch]
    assert fields["general.architecture"] == arch
    assert fields[f"{arch}.block_count"] == 2 and fields[f"{arch}.embedding_length"] == 64
    assert fields[f"{arch}.attention.key_length"] == shape.head_dim
    tensors = {t.name: t for t in reader.tensors}
    plan = tensor_plan(shape)
    assert set(tensors) == {p.name for p in plan}
    for p in plan:
        assert tuple(int(d) for d in tensors[p.name].shape[::-1]) == p.shape  # ggml ne reversed
        expected = GGMLQuantizationType.F32 if p.is_norm else GGMLQuantizationType.Q8_0
        assert tensors[p.name].tensor_type == expected
    if arch == "qwen3":
        assert "blk.1.attn_q_norm.weight" in tensors and "blk.1.attn_k_norm.weight" in tensors
    source = source_tokenizer()
    assert {k for k in fields if k.startswith("tokenizer.")} == set(source)
    for key, value in source.items():
        assert fields[key] == value, key
    assert len(fields["tokenizer.ggml.tokens"]) == TOKENIZER_VOCAB


def test_named_shapes_and_sizes():
    # with Qwen3's own vocabulary the file is as large as the published Qwen3-8B Q8_0 GGUF (8.71 GB)
    real_vocab = replace(SHAPES["qwen3-8b"], vocab=151936)
    assert planned_bytes(real_vocab, "q8_0") / 1e9 == pytest.approx(8.71, abs=0.05)
    qwen = tensor_plan(SHAPES["qwen3-0.6b"])
    assert next(p for p in qwen if p.name == "blk.0.attn_q.weight").shape == (2048, 1024)
    assert not any(p.name == "output.weight" for p in qwen)
    assert any(p.name == "output.weight" for p in tensor_plan(SHAPES["qwen3-8b"]))


def test_bad_shapes_are_refused(tmp_path, capsys):
    with pytest.raises(ValueError, match="multiple of 32"):
        ModelShape("llama", 1, 48, 3, 1, 96, 16).validate()
    with pytest.raises(ValueError, match="n_head_kv"):
        ModelShape("llama", 1, 64, 4, 3, 128, 16).validate()
    with pytest.raises(ValueError, match="vocab"):
        ModelShape("qwen3", 1, 64, 4, 2, 128, 32, vocab=1000).validate()
    assert main(["--shape", "custom", "--n-layer", "1", "--out", str(tmp_path / "x.gguf")]) == 2
    assert "--n-embd" in capsys.readouterr().err
    assert not (tmp_path / "x.gguf").exists()


def test_padded_vocabulary(tmp_path):
    shape = ModelShape("llama", n_layer=1, n_embd=32, n_head=2, n_head_kv=2, n_ff=64, head_dim=16,
                       vocab=TOKENIZER_VOCAB + 64)
    path = write_model(shape, "f16", tmp_path / "padded.gguf")
    reader = GGUFReader(str(path))
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    types = reader.fields["tokenizer.ggml.token_type"].contents()
    assert len(tokens) == len(types) == TOKENIZER_VOCAB + 64 and tokens[-1].startswith("<|arbor_synthetic_pad_")
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    assert embd.tensor_type == GGMLQuantizationType.F16 and int(embd.shape[1]) == TOKENIZER_VOCAB + 64


# -- llama.cpp -----------------------------------------------------------------------------

llama_cpp_missing = importlib.util.find_spec("llama_cpp") is None


def _tokenize(llama_cpp, vocab, text: bytes) -> list[int]:
    buffer = (llama_cpp.llama_token * 256)()
    n = llama_cpp.llama_tokenize(vocab, text, len(text), buffer, 256, True, True)
    assert n > 0
    return list(buffer[:n])


@pytest.mark.skipif(llama_cpp_missing, reason="llama-cpp-python is not importable (still being built?)")
@pytest.mark.parametrize("arch", sorted(TINY))
def test_llama_cpp_loads_and_decodes(tiny_models, arch):
    import llama_cpp

    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(str(tiny_models[arch]).encode(), params)
    assert model, "llama.cpp refused the synthetic model"
    vocab_params = llama_cpp.llama_model_default_params()
    vocab_params.vocab_only = True
    reference = llama_cpp.llama_model_load_from_file(str(embedded_tokenizer_path()).encode(), vocab_params)
    assert reference
    ctx = None
    try:
        assert llama_cpp.llama_model_n_layer(model) == 2 and llama_cpp.llama_model_n_embd(model) == 64
        vocab = llama_cpp.llama_model_get_vocab(model)
        n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        assert n_vocab == TOKENIZER_VOCAB
        text = b"The pump pressure rose above the alarm threshold."
        tokens = _tokenize(llama_cpp, vocab, text)
        assert tokens == _tokenize(llama_cpp, llama_cpp.llama_model_get_vocab(reference), text)

        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx, cparams.n_batch, cparams.n_ubatch = 128, 64, 64
        cparams.n_threads = cparams.n_threads_batch = 1
        ctx = llama_cpp.llama_init_from_model(model, cparams)
        assert ctx

        def decode(ids: list[int]) -> np.ndarray:
            array = (llama_cpp.llama_token * len(ids))(*ids)
            assert llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(array, len(ids))) == 0
            pointer = llama_cpp.llama_get_logits_ith(ctx, -1)
            return np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)),
                                         shape=(n_vocab,)).copy()

        logits = decode(tokens)
        generated = []
        for _ in range(4):
            assert np.isfinite(logits).all() and logits.std() > 0
            generated.append(int(logits.argmax()))
            logits = decode(generated[-1:])
        assert all(0 <= t < n_vocab for t in generated)
    finally:
        if ctx:
            llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)
        llama_cpp.llama_model_free(reference)
