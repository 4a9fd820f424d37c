"""POST /tokenize, /detokenize, /apply-template (llama-server compatible).

Tokenizing and detokenizing run in a worker thread: a body of up to --max-body-kib of text takes
seconds to tokenize on a small CPU, and on the event loop that would hold back every streamed
token of every other request meanwhile (llama.cpp's tokenizer only reads the vocabulary, and
ctypes lets go of the GIL while it runs).
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends

from server.api.engine_bridge.conversation import render_conversation
from server.api.engine_bridge.prompting import chat_options, templates
from server.api.http.deps import ModelDep, StateDep, require_api_key
from server.api.http.errors import invalid
from server.api.protocols.llama_server.request import ApplyTemplateRequest, DetokenizeRequest, TokenizeRequest

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, model: ModelDep):
    rt = model.runtime
    tokens = await asyncio.to_thread(rt.tokenize, body.content, add_special=body.add_special,
                                     parse_special=body.parse_special)
    if not body.with_pieces:
        return {"tokens": tokens}
    return {"tokens": await asyncio.to_thread(
        lambda: [{"id": t, "piece": rt.piece(t, special=True).decode("utf-8", errors="replace")} for t in tokens])}


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, model: ModelDep):
    n_vocab = model.runtime.info.n_vocab
    if any(not 0 <= t < n_vocab for t in body.tokens):
        raise invalid(f"token ids must be in 0..{n_vocab - 1}", param="tokens")
    return {"content": await asyncio.to_thread(model.runtime.detokenize, body.tokens, special=True)}


@router.post("/apply-template")
async def apply_template(body: ApplyTemplateRequest, model: ModelDep, state: StateDep):
    """The prompt a chat request renders to: the same path as /v1/chat/completions."""
    return {"prompt": render_conversation(templates(model), body, chat_options(state.settings))}
