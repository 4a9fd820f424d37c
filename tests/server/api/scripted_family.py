"""Family models that write their family's tool-call trigger by themselves, for the tests of each
family's own constrained path (no client grammar): tests/server/api/test_family_constraints_real.py.

A one-layer model (harness/models/family_model.py's shape) carrying a family's tokenizer and chat
template, with weights set so that it is a bigram machine along one chain of tokens: after the
prompt's last token it writes the chain's first token; each chain token is followed by the next;
the last, and every token outside the chain, by end-of-generation. The chain spells the family's
trigger (`<tool_call>` and a newline, `[TOOL_CALLS]`, ` to` of gpt-oss's `assistant to=functions.x`):
unconstrained, the model writes the trigger and stops; with the family's lazy grammar, the grammar
wakes on that text and must finish a call first. Where the preferred token is not allowed (inside a
grammar) the model's other logits are random, so the grammar decides alone. How: attention and
feed-forward outputs are zero (the residual stream is the token's embedding), the prompt's last
token and each chain token have a direction of their own, every other token shares one, and the
output matrix (untied) maps each direction to the token that follows.

Vocabulary. The pinned llama.cpp ships none of these families' vocabularies with their control
tokens: ggml-vocab-qwen2.gguf is Qwen2's (Qwen2.5 and Qwen3 add <tool_call>, <think> and others
at 151646-151668), ggml-vocab-llama-bpe.gguf is Llama 3's (3.1 names 128008 <|eom_id|> and 128010
<|python_tag|>), and there is no o200k_harmony (gpt-oss), Tekken (Mistral-Nemo, Devstral) or
Hermes 3 vocabulary. `OWN_TOKENS` puts the added tokens of Qwen3 and Llama 3.1 at their ids, which
makes those two their families' own vocabularies; gpt-oss, Mistral-Nemo, Devstral and
Hermes 3 keep harness/models/family_model.py's stand-in, where their control tokens are plain text
of several tokens (the triggers are then patterns over text, not tokens).
"""

from __future__ import annotations

import functools
import re
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import numpy as np
from gguf import TokenType
from gguf.quants import quantize

from harness.models import synth_model
from harness.models.family_model import FAMILIES, template_text, vocab_file

_QWEN25 = {151646: "<|object_ref_start|>", 151647: "<|object_ref_end|>", 151648: "<|box_start|>",
           151649: "<|box_end|>", 151650: "<|quad_start|>", 151651: "<|quad_end|>", 151652: "<|vision_start|>",
           151653: "<|vision_end|>", 151654: "<|vision_pad|>", 151655: "<|image_pad|>", 151656: "<|video_pad|>",
           151657: "<tool_call>", 151658: "</tool_call>", 151659: "<|fim_prefix|>", 151660: "<|fim_middle|>",
           151661: "<|fim_suffix|>", 151662: "<|fim_pad|>", 151663: "<|repo_name|>", 151664: "<|file_sep|>"}
_QWEN3 = {**_QWEN25, 151665: "<tool_response>", 151666: "</tool_response>", 151667: "<think>", 151668: "</think>"}
#: family -> {token id: text} of the tokens its own vocabulary adds to the pinned llama.cpp's base
OWN_TOKENS: dict[str, dict[int, str]] = {
    "qwen3": _QWEN3,
    "llama3.1": {128004: "<|finetune_right_pad_id|>", 128008: "<|eom_id|>", 128010: "<|python_tag|>"},
}
# Control tokens are not written as text; the tag-like tokens (<tool_call>, <think>) are, as in the
# families' own GGUF files.
_CONTROL_PREFIXES = ("<|",)

#: family -> the text its model writes: its tool-call trigger (two newlines where one ends the
#: trigger: a grammar's `space` takes the second, and "\n" alone may be the prompt's last token)
TRIGGER_TEXT = {
    "qwen3": "<tool_call>\n\n",
    "hermes3": "<tool_call>\n\n",
    "gpt-oss": " to",  # the recipient of a call in its header: "<|start|>assistant to=functions.x"
    "mistral-nemo": "[TOOL_CALLS]",
    "devstral": "[TOOL_CALLS]",
    "llama3.1": '{"name": ',
}

#: family -> a token its model prefers next to the end where the end is not allowed: gpt-oss's call
#: header may carry a free identifier (`<|constrain|>json`), which random logits would spell forever;
#: preferring the `<` of `<|message|>` ends it
STEER_TEXT = {"gpt-oss": "<"}

N_EMBD = 64
BIG = 10.0  # the weight that makes the chain's next token win (logits ~80 against ~0.2)


@dataclass(frozen=True)
class ScriptedFamily:
    path: Path
    family: str
    start: int  # the prompt's last token, after which the chain begins
    chain: tuple[int, ...]  # the token ids the model writes, in order
    own_vocabulary: bool  # the family's added tokens are at their ids (OWN_TOKENS)


@functools.cache
def _base_fields(vocab: str) -> tuple:
    return synth_model._read_tokenizer(vocab_file(vocab))  # about 9 s for a 150k vocabulary: once per process


def _fields(family: str) -> list[tuple]:
    own = OWN_TOKENS.get(family, {})
    out = []
    for key, value, vtype, sub in _base_fields(FAMILIES[family].vocab):
        if own and key == "tokenizer.ggml.tokens":
            value = list(value)
            for i, text in own.items():
                value[i] = text
        elif own and key == "tokenizer.ggml.token_type":
            value = list(value)
            for i, text in own.items():
                value[i] = int(TokenType.CONTROL if text.startswith(_CONTROL_PREFIXES) else TokenType.USER_DEFINED)
        out.append((key, value, vtype, sub))
    return out


@functools.cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet, character -> byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _pieces(fields: dict) -> dict[str, list[int]]:
    """Text -> ids of every normal, user-defined or byte token of that text (a byte token is a second
    spelling of a one-character text, which a bigram chain may need: Mistral's `]` ends its prompt)."""
    spm = fields["tokenizer.ggml.model"] == "llama"
    dec = _byte_decoder()
    out: dict[str, list[int]] = {}
    for i, (tok, kind) in enumerate(zip(fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.token_type"])):
        if kind == TokenType.USER_DEFINED:
            text = tok
        elif kind == TokenType.BYTE and re.fullmatch(r"<0x[2-7][0-9A-F]>", tok):
            text = chr(int(tok[3:5], 16))
        elif kind != TokenType.NORMAL:
            continue
        elif spm:
            text = tok.replace("▁", " ")
        else:
            try:
                text = bytes(dec[c] for c in tok).decode("utf-8")
            except (KeyError, UnicodeDecodeError):
                continue
        out.setdefault(text, []).append(i)
    return out


def spell(text: str, pieces: dict[str, list[int]], avoid: set[int]) -> tuple[int, ...]:
    """`text` as tokens no two of which are the same (a bigram machine cannot repeat one), none in
    `avoid`; longest pieces first."""
    def go(i: int, used: tuple[int, ...]) -> tuple[int, ...] | None:
        if i == len(text):
            return used
        for j in range(len(text), i, -1):
            for t in pieces.get(text[i:j], ()):
                if t not in used and t not in avoid:
                    found = go(j, (*used, t))
                    if found is not None:
                        return found
        return None

    found = go(0, ())
    if found is None:
        raise ValueError(f"{text!r} cannot be spelled with distinct tokens")
    return found


def _weights(plan, qtype, seed: int, *, start: int, chain: tuple[int, ...], eog: int, steer: int | None,
             n_vocab: int):
    """Directions: 0 shared by every other token (-> end, else `steer`), 1 the prompt's last token (-> the
    chain's first), 2 + k chain token k (-> chain token k + 1, the last -> end)."""
    rng = np.random.default_rng([seed, 7])
    used = len(chain) + 2
    if plan.name == "token_embd.weight":
        w = (rng.standard_normal((n_vocab, N_EMBD), dtype=np.float32) * np.float32(synth_model.WEIGHT_SCALE))
        w[:, 0] = 1.0
        w[:, 1:used] = 0.0
        for k, t in enumerate((start, *chain)):
            w[t] = 0.0
            w[t, k + 1] = 1.0
    elif plan.name == "output.weight":
        w = (rng.standard_normal((n_vocab, N_EMBD), dtype=np.float32) * np.float32(synth_model.WEIGHT_SCALE))
        w[:, :used] = 0.0  # no token but the one that follows reads these directions
        w[eog, 0] = BIG
        if steer is not None:
            w[steer, 0] = BIG / 2
        for k, t in enumerate(chain):
            w[t, k + 1] = BIG
        w[eog, used - 1] = BIG
    elif plan.name.endswith(("attn_output.weight", "ffn_down.weight")):
        w = np.zeros(plan.shape, dtype=np.float32)
    else:
        return None
    return quantize(w, qtype)


def last_token(family: str, prompt: str) -> int:
    """The last token of `prompt` as the family's vocabulary tokenizes it (special tokens parsed):
    the pinned llama.cpp's vocabulary file, loaded alone (the added tokens of OWN_TOKENS never end a
    generation prompt)."""
    import llama_cpp

    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(vocab_file(FAMILIES[family].vocab)).encode(), params)
    assert model, "llama.cpp could not load the vocabulary"
    try:
        vocab = llama_cpp.llama_model_get_vocab(model)
        text = prompt.encode()
        out = (llama_cpp.llama_token * (len(text) + 8))()
        n = llama_cpp.llama_tokenize(vocab, text, len(text), out, len(out), False, True)
        assert n > 0, n
        return int(out[n - 1])
    finally:
        llama_cpp.llama_model_free(model)


def write_scripted_family(family: str, out: Path, prompt: str) -> ScriptedFamily:
    """The family's scripted model at `out`, writing its trigger after `prompt` (the rendered text
    of the requests it will answer: only its last token matters)."""
    fields = {k: v for k, v, *_ in _fields(family)}
    n_vocab = len(fields["tokenizer.ggml.tokens"])
    start = last_token(family, prompt)
    pieces = _pieces(fields)
    chain = spell(TRIGGER_TEXT[family], pieces, {start})
    eog = int(fields["tokenizer.ggml.eos_token_id"])
    steer = pieces[STEER_TEXT[family]][0] if family in STEER_TEXT else None
    shape = synth_model.ModelShape("llama", n_layer=1, n_embd=N_EMBD, n_head=4, n_head_kv=2, n_ff=128, head_dim=16,
                                   vocab=n_vocab, tokenizer_vocab=n_vocab, context_length=8192,
                                   tied_embeddings=False)
    real = synth_model._tensor_data

    def data(plan, qtype, seed):
        w = _weights(plan, qtype, seed, start=start, chain=chain, eog=eog, steer=steer, n_vocab=n_vocab)
        return real(plan, qtype, seed) if w is None else w

    def tokenizer(source, vocab):
        return iter(_fields(family))

    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(synth_model, "_tensor_data", data))
        stack.enter_context(mock.patch.object(synth_model, "tokenizer_fields", tokenizer))
        synth_model.write_model(shape, "q8_0", out, seed=0, name=family,
                                tokenizer_source=vocab_file(FAMILIES[family].vocab),
                                chat_template=template_text(FAMILIES[family].template))
    return ScriptedFamily(out, family, start, chain, family in OWN_TOKENS)
