"""Write a random-weight DeepSeek-V2-style (``deepseek2``, MLA) GGUF model.

MLA models run llama.cpp's K-only attention graph (the KV cache holds one compressed latent per
cell; V is a view of K), which the llama/qwen3 models of ``synth_model.py`` never reach.
This writes that architecture as ``convert_hf_to_gguf.py`` does for DeepSeek-V2 with MLA: one KV
head of ``kv_lora_rank + qk_rope_head_dim`` (``key_length``; ``value_length`` is ``kv_lora_rank``),
``key_length_mla`` / ``value_length_mla`` the per-head sizes after decompression, ``attn_k_b`` /
``attn_v_b`` split from ``kv_b_proj``. Every layer is dense (``leading_dense_block_count`` =
``n_layer``), so no experts are needed. Weights are normal * 0.02, norms 1.0, as in synth_model.

    python -m bench.synth_mla --out var/models/mla-synth.gguf [--tokenizer smollm2] [--type q8_0]

The tokenizer is a small byte-level one by default (``bytes``: 256 byte tokens plus control and
filler tokens; fast to write and load, for tests that feed token ids), or SmolLM2's
(``smollm2``, as synth_model.py, so text tokenizes as with the embedded model).
"""

from __future__ import annotations

import argparse
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType, TokenType
from gguf.quants import quant_shape_to_byte_shape, quantize

from harness.models.synth_model import (
    TOKENIZER_VOCAB,
    WEIGHT_SCALE,
    embedded_tokenizer_path,
    tokenizer_fields,
    write_tensors,
)

TYPES = {
    "f32": (GGMLQuantizationType.F32, LlamaFileType.ALL_F32),
    "f16": (GGMLQuantizationType.F16, LlamaFileType.MOSTLY_F16),
    "q8_0": (GGMLQuantizationType.Q8_0, LlamaFileType.MOSTLY_Q8_0),
}
BYTE_VOCAB_MIN = 3 + 256  # <unk>, <s>, </s> and the 256 byte tokens


@dataclass(frozen=True)
class MLAShape:
    """DeepSeek-V2's attention hyperparameters (the HF config's names), small by default."""

    n_layer: int = 2
    n_embd: int = 256
    n_head: int = 4
    q_lora_rank: int = 128
    kv_lora_rank: int = 128
    qk_nope_head_dim: int = 64
    qk_rope_head_dim: int = 64
    v_head_dim: int = 64
    n_ff: int = 512
    vocab: int = 512
    context_length: int = 4096
    rope_freq_base: float = 10000.0
    rms_eps: float = 1e-6

    def validate(self, tokenizer: str) -> None:
        for name in ("n_layer", "n_embd", "n_head", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                     "qk_rope_head_dim", "v_head_dim", "n_ff", "context_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim must be even for RoPE, got {self.qk_rope_head_dim}")
        # llama.cpp reads these shapes as DeepSeek-V2-Lite & co., which have no q LoRA
        if self.n_layer in (26, 27) or (self.n_layer == 48 and self.vocab == 128256):
            raise ValueError(f"n_layer {self.n_layer} is taken by llama.cpp for a 'lite' layout; pick another")
        low = BYTE_VOCAB_MIN if tokenizer == "bytes" else TOKENIZER_VOCAB
        if self.vocab < low:
            raise ValueError(f"vocab must be at least {low} for the {tokenizer} tokenizer, got {self.vocab}")


def tensor_plan(shape: MLAShape) -> list[tuple[str, tuple[int, ...]]]:
    """(name, numpy shape) of every tensor, as llama.cpp's deepseek2 loader expects with MLA.

    numpy shapes are ggml's ``ne`` reversed; 1-D tensors are norms.
    """
    s = shape
    plan = [("token_embd.weight", (s.vocab, s.n_embd)), ("output_norm.weight", (s.n_embd,)),
            ("output.weight", (s.vocab, s.n_embd))]
    for i in range(s.n_layer):
        b = f"blk.{i}"
        plan += [(f"{b}.attn_norm.weight", (s.n_embd,)),
                 (f"{b}.attn_q_a_norm.weight", (s.q_lora_rank,)),
                 (f"{b}.attn_kv_a_norm.weight", (s.kv_lora_rank,)),
                 (f"{b}.attn_q_a.weight", (s.q_lora_rank, s.n_embd)),
                 (f"{b}.attn_q_b.weight", (s.n_head * (s.qk_nope_head_dim + s.qk_rope_head_dim), s.q_lora_rank)),
                 (f"{b}.attn_kv_a_mqa.weight", (s.kv_lora_rank + s.qk_rope_head_dim, s.n_embd)),
                 # ne {qk_nope, kv_lora_rank, n_head} and {kv_lora_rank, v_head_dim, n_head}
                 (f"{b}.attn_k_b.weight", (s.n_head, s.kv_lora_rank, s.qk_nope_head_dim)),
                 (f"{b}.attn_v_b.weight", (s.n_head, s.v_head_dim, s.kv_lora_rank)),
                 (f"{b}.attn_output.weight", (s.n_embd, s.n_head * s.v_head_dim)),
                 (f"{b}.ffn_norm.weight", (s.n_embd,)),
                 (f"{b}.ffn_gate.weight", (s.n_ff, s.n_embd)),
                 (f"{b}.ffn_up.weight", (s.n_ff, s.n_embd)),
                 (f"{b}.ffn_down.weight", (s.n_embd, s.n_ff))]
    return plan


def _tensor(name: str, np_shape: tuple[int, ...], qtype: GGMLQuantizationType, seed: int) -> np.ndarray:
    if len(np_shape) == 1:
        return np.ones(np_shape, dtype=np.float32)
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    data = rng.standard_normal(np_shape, dtype=np.float32) * np.float32(WEIGHT_SCALE)
    return data if qtype == GGMLQuantizationType.F32 else quantize(data, qtype)


def _byte_tokenizer(writer: GGUFWriter, vocab: int) -> None:
    """A SentencePiece-style ("llama") vocabulary: <unk>, <s>, </s>, the 256 byte tokens, fillers."""
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL, *([TokenType.BYTE] * 256)]
    tokens += [f"\u2581t{i}" for i in range(len(tokens), vocab)]
    types += [TokenType.NORMAL] * (vocab - len(types))
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * vocab)
    writer.add_token_types([int(t) for t in types])
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)


def write_model(shape: MLAShape, out: Path, *, type_name: str = "f16", seed: int = 0, tokenizer: str = "bytes",
                tokenizer_source: Path | None = None) -> Path:
    """Write the GGUF file; returns its path."""
    shape.validate(tokenizer)
    if type_name not in TYPES:
        raise ValueError(f"type must be one of {', '.join(TYPES)}, got {type_name!r}")
    if tokenizer not in ("bytes", "smollm2"):
        raise ValueError(f"tokenizer must be bytes or smollm2, got {tokenizer!r}")
    qtype, file_type = TYPES[type_name]
    plan = tensor_plan(shape)
    if qtype == GGMLQuantizationType.Q8_0:
        bad = [n for n, sh in plan if len(sh) > 1 and sh[-1] % 32]
        if bad:
            raise ValueError(f"q8_0 needs rows of a multiple of 32 values: {', '.join(bad)}")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    s = shape

    writer = GGUFWriter(out, "deepseek2")
    writer.add_type("model")
    writer.add_name(f"arbor-synthetic-deepseek2-mla-{type_name}")
    writer.add_description("Random weights (arbor bench/synth_mla.py)")
    writer.add_context_length(s.context_length)
    writer.add_embedding_length(s.n_embd)
    writer.add_block_count(s.n_layer)
    writer.add_feed_forward_length(s.n_ff)
    writer.add_head_count(s.n_head)
    writer.add_head_count_kv(1)  # MLA runs as MQA over the compressed latent
    writer.add_key_length(s.kv_lora_rank + s.qk_rope_head_dim)
    writer.add_value_length(s.kv_lora_rank)
    writer.add_key_length_mla(s.qk_nope_head_dim + s.qk_rope_head_dim)
    writer.add_value_length_mla(s.v_head_dim)
    writer.add_q_lora_rank(s.q_lora_rank)
    writer.add_kv_lora_rank(s.kv_lora_rank)
    writer.add_rope_dimension_count(s.qk_rope_head_dim)
    writer.add_rope_freq_base(s.rope_freq_base)
    writer.add_layer_norm_rms_eps(s.rms_eps)
    writer.add_leading_dense_block_count(s.n_layer)  # no MoE layer
    writer.add_expert_feed_forward_length(s.n_ff)  # required by the loader even without experts
    writer.add_expert_shared_count(0)
    writer.add_vocab_size(s.vocab)
    writer.add_file_type(int(file_type))
    writer.add_quantization_version(2)
    if tokenizer == "bytes":
        _byte_tokenizer(writer, s.vocab)
    else:
        for key, value, vtype, sub_type in tokenizer_fields(tokenizer_source or embedded_tokenizer_path(), s.vocab):
            writer.add_key_value(key, value, vtype, sub_type)

    infos: list[tuple[str, GGMLQuantizationType, tuple[int, ...], int]] = []
    for name, np_shape in plan:
        stored = GGMLQuantizationType.F32 if len(np_shape) == 1 else qtype
        if stored in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            itemsize = 4 if stored == GGMLQuantizationType.F32 else 2
            infos.append((name, stored, np_shape, itemsize * int(np.prod(np_shape))))
        else:
            array_shape = tuple(quant_shape_to_byte_shape(np_shape, stored))
            infos.append((name, stored, array_shape, int(np.prod(array_shape))))
    shapes = dict(plan)
    write_tensors(writer, infos, lambda name: _tensor(name, shapes[name], qtype, seed))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--type", choices=list(TYPES), default="f16")
    parser.add_argument("--tokenizer", choices=["bytes", "smollm2"], default="bytes")
    parser.add_argument("--seed", type=int, default=0)
    defaults = MLAShape()
    for field in ("n_layer", "n_embd", "n_head", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                  "qk_rope_head_dim", "v_head_dim", "n_ff", "vocab", "context_length"):
        parser.add_argument(f"--{field.replace('_', '-')}", type=int, default=getattr(defaults, field))
    args = parser.parse_args(argv)
    fields = {k: getattr(args, k) for k in MLAShape.__dataclass_fields__ if hasattr(args, k)}
    if args.tokenizer == "smollm2" and args.vocab == defaults.vocab:
        fields["vocab"] = TOKENIZER_VOCAB
    try:
        write_model(MLAShape(**fields), args.out, type_name=args.type, seed=args.seed, tokenizer=args.tokenizer)
    except (ValueError, OSError) as exc:
        print(f"synth_mla: error: {exc}", file=sys.stderr)
        return 2
    print(args.out)
    return 0

