"""The KV cache's element types (`--cache-type-k`, `--cache-type-v`): llama-server's names and
ggml's type ids, without importing llama.cpp (settings and the cache's parser use them).

Contract:
- `KV_CACHE_TYPES` are the names llama-server's `-ctk` / `-ctv` accept (common/arg.cpp,
  `kv_cache_types`), in its order; `GGML_TYPE_IDS` maps each to its `enum ggml_type` value.
- `is_quantized(name)` is ggml_is_quantized for those names: a block of several elements per
  row entry. llama.cpp stores V transposed (one row per element across cells) when flash
  attention is off, which only an unquantized V allows: a quantized V needs flash attention.
- `QUANTIZED_TYPE_IDS`: the ggml ids of the quantized ones (the cache's state parser refuses a
  transposed V of these: its cells cannot be split one token at a time).
"""

from __future__ import annotations

from typing import Literal, get_args

KVCacheType = Literal["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]
KV_CACHE_TYPES: tuple[str, ...] = get_args(KVCacheType)

# ggml/include/ggml.h, enum ggml_type
GGML_TYPE_IDS: dict[str, int] = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8,
                                 "iq4_nl": 20, "bf16": 30}
_UNQUANTIZED = frozenset({"f32", "f16", "bf16"})
QUANTIZED_TYPE_IDS = frozenset(GGML_TYPE_IDS[t] for t in KV_CACHE_TYPES if t not in _UNQUANTIZED)


def is_quantized(name: str) -> bool:
    return name not in _UNQUANTIZED
