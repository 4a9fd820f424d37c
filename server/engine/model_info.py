"""What the loaded model says about itself (llama.cpp's model and vocabulary queries), read once at load:
/props, /v1/models and the cache's fingerprint show it."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass

import llama_cpp


@dataclass(frozen=True)
class ModelInfo:
    """Facts about the loaded model, for /props, /v1/models and the cache's fingerprint."""

    path: str
    description: str
    architecture: str
    n_params: int
    size_bytes: int
    n_ctx_train: int
    n_vocab: int
    n_layer: int
    n_embd: int
    n_swa: int
    is_recurrent: bool
    is_hybrid: bool
    chat_template: str | None
    bos_token: str
    eos_token: str
    add_bos: bool


def model_meta(model, key: str) -> str | None:
    """The GGUF metadata value `key` of a loaded model as text, or None when it has none."""
    buf = ctypes.create_string_buffer(1 << 16)
    n = llama_cpp.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    if n < 0:
        return None
    if n >= len(buf):
        buf = ctypes.create_string_buffer(n + 1)
        llama_cpp.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode("utf-8", errors="replace")


def read_model_info(model, vocab, path: str, piece: Callable[..., bytes]) -> ModelInfo:
    """The facts of a loaded `model` (and its `vocab`); `piece(token, special=True)` renders a token."""
    desc = ctypes.create_string_buffer(256)
    llama_cpp.llama_model_desc(model, desc, len(desc))
    template_ptr = llama_cpp.llama_model_chat_template(model, None)
    template = template_ptr.decode("utf-8") if template_ptr else None
    bos = llama_cpp.llama_vocab_bos(vocab)
    eos = llama_cpp.llama_vocab_eos(vocab)
    return ModelInfo(
        path=path,
        description=desc.value.decode(errors="replace"),
        architecture=model_meta(model, "general.architecture") or "unknown",
        n_params=int(llama_cpp.llama_model_n_params(model)),
        size_bytes=int(llama_cpp.llama_model_size(model)),
        n_ctx_train=int(llama_cpp.llama_model_n_ctx_train(model)),
        n_vocab=int(llama_cpp.llama_vocab_n_tokens(vocab)),
        n_layer=int(llama_cpp.llama_model_n_layer(model)),
        n_embd=int(llama_cpp.llama_model_n_embd(model)),
        n_swa=int(llama_cpp.llama_model_n_swa(model)),
        is_recurrent=bool(llama_cpp.llama_model_is_recurrent(model)),
        is_hybrid=bool(llama_cpp.llama_model_is_hybrid(model)),
        chat_template=template,
        bos_token=piece(bos, special=True).decode(errors="replace") if bos >= 0 else "",
        eos_token=piece(eos, special=True).decode(errors="replace") if eos >= 0 else "",
        add_bos=bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
    )
