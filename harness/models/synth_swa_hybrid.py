"""Write random-weight models of a sliding-window (Gemma 3) and a hybrid (LFM2) architecture.

The cache's prefix reuse on models whose state the full-attention KV cannot rebuild (issue 32:
sliding-window layers keep only the last ``n_swa`` cells; recurrent layers keep one state per
sequence) needs such models to test and measure on, without downloading weights. This writes:

- ``gemma3``: interleaved sliding-window attention (``attention.sliding_window`` = n_swa, and
  ``attention.sliding_window_pattern`` = P: layer il slides unless il % P == P - 1, so every P-th
  layer is global, as llama.cpp's ``set_swa_pattern``; Gemma 3 itself has P = 6). Q/K norms, post
  attention/FFN norms, GELU FFN, separate RoPE bases for the global and sliding layers.
- ``lfm2``: short-convolution layers (``shortconv.*``, recurrent: one conv state of
  ``(l_cache - 1) * n_embd`` per sequence) and attention layers, chosen by a per-layer
  ``attention.head_count_kv`` array (0 = conv layer), as LFM2's GGUFs do. llama.cpp runs it on
  ``llama_memory_hybrid`` (``llama_model_is_hybrid`` is true).

Weights are normal * 0.02 (q8_0 or f16), norms 1.0 and the conv kernels F32, as in
synth_model.py. The tokenizer is SmolLM2's (the embedded model's, so text tokenizes as
with it; its ChatML template comes along) or any ``models/ggml-vocab-<name>.gguf`` of the pinned
llama.cpp with the template it carries (``gemma-4`` for the Gemma family: 262144 tokens). Each
architecture has two presets: ``tiny`` for tests (a few MB, window 32) and ``bench``, a
realistic size for benchmarks (hundreds of MB):

    python -m bench.synth_swa_hybrid --arch gemma3 --shape bench --out var/models/gemma3-swa-synth.gguf
    python -m bench.synth_swa_hybrid --arch lfm2 --shape tiny --out /tmp/lfm2-tiny.gguf
    python -m bench.synth_swa_hybrid --list
"""

from __future__ import annotations

import argparse
import shutil
import sys
import zlib
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quant_shape_to_byte_shape, quantize

from harness.models.synth_model import (
    ROW_CHUNK,
    TOKENIZER_VOCAB,
    TYPES,
    WEIGHT_SCALE,
    _read_tokenizer,
    embedded_tokenizer_path,
    tokenizer_fields,
    write_tensors,
)

EMBEDDED_TOKENIZER = "smollm2"


@dataclass(frozen=True)
class SWAShape:
    """Gemma 3's hyperparameters: ``n_swa`` cells of window, every ``swa_pattern``-th layer global."""

    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_swa: int
    swa_pattern: int = 6
    context_length: int = 32768
    rope_freq_base: float = 1_000_000.0  # global layers
    rope_freq_base_swa: float = 10_000.0  # sliding layers
    rms_eps: float = 1e-6
    tokenizer: str = EMBEDDED_TOKENIZER  # "smollm2" or a models/ggml-vocab-<name>.gguf of the pinned llama.cpp

    arch = "gemma3"

    @property
    def swa_layers(self) -> list[int]:
        """The sliding layers, as llama.cpp's set_swa_pattern(P) marks them."""
        return [il for il in range(self.n_layer) if il % self.swa_pattern < self.swa_pattern - 1]

    def validate(self) -> None:
        for name in ("n_layer", "n_embd", "n_head", "n_head_kv", "head_dim", "n_ff", "n_swa", "swa_pattern",
                     "context_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.n_head % self.n_head_kv:
            raise ValueError(f"n_head ({self.n_head}) must be a multiple of n_head_kv ({self.n_head_kv})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if not self.swa_layers or len(self.swa_layers) == self.n_layer:
            raise ValueError(f"pattern {self.swa_pattern} over {self.n_layer} layers must give both sliding "
                             f"and global layers")


@dataclass(frozen=True)
class HybridShape:
    """LFM2's hyperparameters: ``attn_layers`` are attention, every other layer a short convolution."""

    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    attn_layers: tuple[int, ...]
    l_cache: int = 3  # conv kernel width; the state keeps l_cache - 1 columns
    context_length: int = 32768
    rope_freq_base: float = 1_000_000.0
    rms_eps: float = 1e-5
    tokenizer: str = EMBEDDED_TOKENIZER

    arch = "lfm2"

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def validate(self) -> None:
        for name in ("n_layer", "n_embd", "n_head", "n_head_kv", "n_ff", "context_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.n_embd % self.n_head or self.head_dim % 2:
            raise ValueError(f"n_embd / n_head must be an even integer, got {self.n_embd} / {self.n_head}")
        if self.n_head % self.n_head_kv:
            raise ValueError(f"n_head ({self.n_head}) must be a multiple of n_head_kv ({self.n_head_kv})")
        if self.l_cache < 2:
            raise ValueError(f"l_cache must be at least 2, got {self.l_cache}")
        if not self.attn_layers or any(not 0 <= il < self.n_layer for il in self.attn_layers) \
                or len(set(self.attn_layers)) >= self.n_layer:
            raise ValueError(f"attn_layers {self.attn_layers} must name some but not all of {self.n_layer} layers")


#: (architecture, preset) -> shape. `tiny`: tests (a few MB with SmolLM2's vocabulary, loads in well
#: under a second); `bench`: benchmarks (hundreds of MB).
SHAPES: dict[tuple[str, str], SWAShape | HybridShape] = {
    # 6 layers as Gemma 3's pattern: 0-4 slide over 32 cells, 5 is global
    ("gemma3", "tiny"): SWAShape(n_layer=6, n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_ff=128, n_swa=32,
                                 context_length=4096),
    # Gemma 3's layout (one KV head of 256, window 512, pattern 6) at 24 layers x 1024 (20 sliding, 4 global),
    # with the Gemma family's 262144-token vocabulary: ~0.67 GB at q8_0 (~0.44 GB with --tokenizer smollm2)
    ("gemma3", "bench"): SWAShape(n_layer=24, n_embd=1024, n_head=4, n_head_kv=1, head_dim=256, n_ff=4096,
                                  n_swa=512, tokenizer="gemma-4"),
    # conv, attention, conv, attention
    ("lfm2", "tiny"): HybridShape(n_layer=4, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, attn_layers=(1, 3),
                                  context_length=4096),
    # LFM2-350M's layout (16 layers, attention at 2, 5, 8, 10, 12, 14); LFM2's own tokenizer is not in the
    # pinned llama.cpp, so SmolLM2's (49152 tokens): ~0.36 GB at q8_0
    ("lfm2", "bench"): HybridShape(n_layer=16, n_embd=1024, n_head=16, n_head_kv=8, n_ff=4608,
                                   attn_layers=(2, 5, 8, 10, 12, 14)),
}
SIZES = ("tiny", "bench")


@dataclass(frozen=True)
class Tensor:
    """One tensor to write: GGUF name, numpy shape (ggml ``ne`` reversed) and kind: ``norm`` (F32 ones),
    ``f32`` (F32 random: the conv kernels, which ggml_ssm_conv takes only in F32) or ``weight``."""

    name: str
    shape: tuple[int, ...]
    kind: str = "weight"


def tensor_plan(shape: SWAShape | HybridShape) -> list[Tensor]:
    """Tensor names and shapes as llama.cpp's gemma3 / lfm2 loaders expect them (tied output)."""
    s = shape
    if isinstance(s, SWAShape):
        plan = [Tensor("token_embd.weight", (tokenizer_vocab(s.tokenizer), s.n_embd)),
                Tensor("output_norm.weight", (s.n_embd,), "norm")]
        q_dim, kv_dim = s.n_head * s.head_dim, s.n_head_kv * s.head_dim
        for i in range(s.n_layer):
            b = f"blk.{i}"
            plan += [Tensor(f"{b}.attn_norm.weight", (s.n_embd,), "norm"),
                     Tensor(f"{b}.attn_q.weight", (q_dim, s.n_embd)),
                     Tensor(f"{b}.attn_k.weight", (kv_dim, s.n_embd)),
                     Tensor(f"{b}.attn_v.weight", (kv_dim, s.n_embd)),
                     Tensor(f"{b}.attn_output.weight", (s.n_embd, q_dim)),
                     Tensor(f"{b}.attn_q_norm.weight", (s.head_dim,), "norm"),
                     Tensor(f"{b}.attn_k_norm.weight", (s.head_dim,), "norm"),
                     Tensor(f"{b}.post_attention_norm.weight", (s.n_embd,), "norm"),
                     Tensor(f"{b}.ffn_norm.weight", (s.n_embd,), "norm"),
                     Tensor(f"{b}.ffn_gate.weight", (s.n_ff, s.n_embd)),
                     Tensor(f"{b}.ffn_up.weight", (s.n_ff, s.n_embd)),
                     Tensor(f"{b}.ffn_down.weight", (s.n_embd, s.n_ff)),
                     Tensor(f"{b}.post_ffw_norm.weight", (s.n_embd,), "norm")]
        return plan
    plan = [Tensor("token_embd.weight", (tokenizer_vocab(s.tokenizer), s.n_embd)),
            Tensor("token_embd_norm.weight", (s.n_embd,), "norm")]  # LFM2's output norm (llama.cpp's name)
    kv_dim = s.n_head_kv * s.head_dim
    for i in range(s.n_layer):
        b = f"blk.{i}"
        plan.append(Tensor(f"{b}.attn_norm.weight", (s.n_embd,), "norm"))
        if i in s.attn_layers:
            plan += [Tensor(f"{b}.attn_q_norm.weight", (s.head_dim,), "norm"),
                     Tensor(f"{b}.attn_k_norm.weight", (s.head_dim,), "norm"),
                     Tensor(f"{b}.attn_q.weight", (s.n_embd, s.n_embd)),
                     Tensor(f"{b}.attn_k.weight", (kv_dim, s.n_embd)),
                     Tensor(f"{b}.attn_v.weight", (kv_dim, s.n_embd)),
                     Tensor(f"{b}.attn_output.weight", (s.n_embd, s.n_embd))]
        else:
            plan += [Tensor(f"{b}.shortconv.conv.weight", (s.n_embd, s.l_cache), "f32"),
                     Tensor(f"{b}.shortconv.in_proj.weight", (3 * s.n_embd, s.n_embd)),
                     Tensor(f"{b}.shortconv.out_proj.weight", (s.n_embd, s.n_embd))]
        plan += [Tensor(f"{b}.ffn_norm.weight", (s.n_embd,), "norm"),
                 Tensor(f"{b}.ffn_gate.weight", (s.n_ff, s.n_embd)),
                 Tensor(f"{b}.ffn_up.weight", (s.n_ff, s.n_embd)),
                 Tensor(f"{b}.ffn_down.weight", (s.n_embd, s.n_ff))]
    return plan


def _stored(t: Tensor, qtype: GGMLQuantizationType) -> tuple[GGMLQuantizationType, tuple[int, ...], int]:
    """(type, array shape, bytes) on disk: F32/F16 arrays have the tensor's shape, quantized ones
    are uint8 rows of blocks."""
    if t.kind != "weight":
        return GGMLQuantizationType.F32, t.shape, 4 * int(np.prod(t.shape))
    if qtype == GGMLQuantizationType.F16:
        return qtype, t.shape, 2 * int(np.prod(t.shape))
    byte_shape = tuple(quant_shape_to_byte_shape(t.shape, qtype))
    return qtype, byte_shape, int(np.prod(byte_shape))


def _tensor_data(t: Tensor, qtype: GGMLQuantizationType, seed: int) -> np.ndarray:
    """The tensor's array, generated chunk by chunk (deterministic per seed and name)."""
    if t.kind == "norm":
        return np.ones(t.shape, dtype=np.float32)
    rng = np.random.default_rng([seed, zlib.crc32(t.name.encode())])
    if t.kind == "f32":
        return rng.standard_normal(t.shape, dtype=np.float32) * np.float32(WEIGHT_SCALE)
    rows, cols = t.shape
    _, array_shape, _ = _stored(t, qtype)
    out = np.empty(array_shape, dtype=np.float16 if qtype == GGMLQuantizationType.F16 else np.uint8)
    for start in range(0, rows, ROW_CHUNK):
        stop = min(rows, start + ROW_CHUNK)
        block = rng.standard_normal((stop - start, cols), dtype=np.float32) * np.float32(WEIGHT_SCALE)
        out[start:stop] = quantize(block, qtype)
    return out


def tokenizer_source(name: str) -> Path:
    """The GGUF whose tokenizer.* fields (and chat template) the model carries."""
    if name == EMBEDDED_TOKENIZER:
        return embedded_tokenizer_path()
    from harness.models.family_model import vocab_file  # fetches the pinned release archive once

    path = vocab_file(name)
    if not path.is_file():
        raise ValueError(f"no models/ggml-vocab-{name}.gguf in the pinned llama.cpp")
    return path


def tokenizer_vocab(name: str) -> int:
    """Tokens of the tokenizer (the model's vocabulary)."""
    if name == EMBEDDED_TOKENIZER:
        return TOKENIZER_VOCAB
    fields = {key: value for key, value, *_ in _read_tokenizer(tokenizer_source(name))}
    return len(fields["tokenizer.ggml.tokens"])


def planned_bytes(shape: SWAShape | HybridShape, type_name: str) -> int:
    qtype = TYPES[type_name][0]
    return sum(_stored(t, qtype)[2] for t in tensor_plan(shape))


def write_model(shape: SWAShape | HybridShape, out: Path, *, type_name: str = "q8_0", seed: int = 0,
                name: str = "custom") -> Path:
    """Write the GGUF file; returns its path. Fails before writing if the disk is too small."""
    shape.validate()
    if type_name not in TYPES:
        raise ValueError(f"type must be one of {', '.join(TYPES)}, got {type_name!r}")
    qtype, file_type = TYPES[type_name]
    plan = tensor_plan(shape)
    if qtype == GGMLQuantizationType.Q8_0:
        bad = [t.name for t in plan if t.kind == "weight" and t.shape[-1] % 32]
        if bad:
            raise ValueError(f"q8_0 needs rows of a multiple of 32 values: {', '.join(bad[:4])}")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    need = sum(_stored(t, qtype)[2] for t in plan)
    free = shutil.disk_usage(out.parent).free
    if need + (64 << 20) > free:
        raise OSError(f"{out.parent}: {need / 2**30:.1f} GiB needed, {free / 2**30:.1f} GiB free")
    source = tokenizer_source(shape.tokenizer)
    vocab = tokenizer_vocab(shape.tokenizer)
    s = shape

    writer = GGUFWriter(out, s.arch)
    writer.add_type("model")
    writer.add_name(f"arbor-synthetic-{s.arch}-{name}-{type_name}")
    writer.add_description(f"Random weights (arbor bench/synth_swa_hybrid.py); tokenizer of {source.name}")
    writer.add_context_length(s.context_length)
    writer.add_embedding_length(s.n_embd)
    writer.add_block_count(s.n_layer)
    writer.add_feed_forward_length(s.n_ff)
    writer.add_head_count(s.n_head)
    writer.add_rope_freq_base(s.rope_freq_base)
    writer.add_layer_norm_rms_eps(s.rms_eps)
    if isinstance(s, SWAShape):
        writer.add_head_count_kv(s.n_head_kv)
        writer.add_key_length(s.head_dim)
        writer.add_value_length(s.head_dim)
        writer.add_rope_dimension_count(s.head_dim)
        writer.add_sliding_window(s.n_swa)
        writer.add_sliding_window_pattern(s.swa_pattern)
        writer.add_rope_freq_base_swa(s.rope_freq_base_swa)
    else:
        # 0 KV heads marks a layer recurrent (a short convolution)
        writer.add_head_count_kv([s.n_head_kv if il in s.attn_layers else 0 for il in range(s.n_layer)])
        writer.add_shortconv_l_cache(s.l_cache)
    writer.add_vocab_size(vocab)
    writer.add_file_type(int(file_type))
    writer.add_quantization_version(2)
    for key, value, vtype, sub_type in tokenizer_fields(source, vocab):
        writer.add_key_value(key, value, vtype, sub_type)

    tensors = {t.name: t for t in plan}
    write_tensors(writer, [(t.name, *_stored(t, qtype)) for t in plan],
                  lambda tname: _tensor_data(tensors[tname], qtype, seed))
    return out


def shape_for(arch: str, size: str = "tiny", **overrides: object) -> SWAShape | HybridShape:
    """The preset shape, with fields replaced (e.g. ``n_swa=64``, ``tokenizer="gemma-4"``)."""
    if (arch, size) not in SHAPES:
        raise ValueError(f"no preset {size!r} for {arch!r}: presets are {', '.join(SIZES)}")
    return replace(SHAPES[arch, size], **overrides)  # type: ignore[arg-type]


def write_swa_model(path: Path, size: str = "tiny", *, type_name: str = "q8_0", seed: int = 0,
                    **overrides: object) -> Path:
    """A Gemma-3-shaped sliding-window model at `path` (`size`: tiny or bench)."""
    return write_model(shape_for("gemma3", size, **overrides), path, type_name=type_name, seed=seed, name=size)


def write_hybrid_model(path: Path, size: str = "tiny", *, type_name: str = "q8_0", seed: int = 0,
                       **overrides: object) -> Path:
    """An LFM2-shaped hybrid (short convolutions + attention) model at `path` (`size`: tiny or bench)."""
    return write_model(shape_for("lfm2", size, **overrides), path, type_name=type_name, seed=seed, name=size)


def _describe(shape: SWAShape | HybridShape) -> str:
    if isinstance(shape, SWAShape):
        layout = (f"{len(shape.swa_layers)} sliding (window {shape.n_swa}) + "
                  f"{shape.n_layer - len(shape.swa_layers)} global layers")
    else:
        layout = f"{shape.n_layer - len(shape.attn_layers)} conv + {len(shape.attn_layers)} attention layers"
    return f"{shape.arch}: {layout}, d={shape.n_embd}, tokenizer {shape.tokenizer}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", choices=sorted({a for a, _ in SHAPES}), default="gemma3")
    parser.add_argument("--shape", choices=SIZES, default="tiny")
    parser.add_argument("--type", choices=list(TYPES), default="q8_0")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokenizer", help=f"{EMBEDDED_TOKENIZER} or a models/ggml-vocab-<name>.gguf name "
                                            "(gemma-4, qwen35, ...); default: the preset's")
    parser.add_argument("--n-swa", type=int, help="sliding window in tokens (gemma3)")
    parser.add_argument("--n-layer", type=int)
    parser.add_argument("--context-length", type=int)
    parser.add_argument("--list", action="store_true", help="list the presets")
    args = parser.parse_args(argv)
    if args.list:
        for (arch, size), shape in SHAPES.items():
            print(f"{arch:7} {size:6} {_describe(shape)}")
        return 0
    if args.out is None:
        parser.error("--out is required")
    overrides = {k: v for k, v in (("tokenizer", args.tokenizer), ("n_swa", args.n_swa), ("n_layer", args.n_layer),
                                   ("context_length", args.context_length)) if v is not None}
    try:
        if "n_swa" in overrides and args.arch != "gemma3":
            raise ValueError("--n-swa applies to gemma3 only")
        shape = shape_for(args.arch, args.shape, **overrides)
        shape.validate()
        print(f"{_describe(shape)}, {args.type}: {planned_bytes(shape, args.type) / 2**20:.0f} MiB -> {args.out}",
              file=sys.stderr)
        write_model(shape, args.out, type_name=args.type, seed=args.seed, name=args.shape)
    except (ValueError, OSError) as exc:
        print(f"synth_swa_hybrid: error: {exc}", file=sys.stderr)
        return 2
    print(args.out)
    return 0

