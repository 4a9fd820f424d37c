"""POST /tokenize, /detokenize, /apply-template (llama-server compatible)."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from server.api.conversation import render_conversation
from server.api.deps import ModelDep, StateDep, require_api_key
from server.api.errors import invalid
from server.api.prompting import chat_options
from server.api.schemas import ApplyTemplateRequest, DetokenizeRequest, TokenizeRequest

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, model: ModelDep):
    rt = model.runtime
    tokens = rt.tokenize(body.content, add_special=body.add_special, parse_special=body.parse_special)
    if not body.with_pieces:
        return {"tokens": tokens}
    return {"tokens": [{"id": t, "piece": rt.piece(t, special=True).decode("utf-8", errors="replace")} for t in tokens]}


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, model: ModelDep):
    n_vocab = model.runtime.info.n_vocab
    if any(not 0 <= t < n_vocab for t in body.tokens):
        raise invalid(f"token ids must be in 0..{n_vocab - 1}", param="tokens")
    return {"content": model.runtime.detokenize(body.tokens, special=True)}


@router.post("/apply-template")
async def apply_template(body: ApplyTemplateRequest, model: ModelDep, state: StateDep):
    """The prompt a chat request renders to: the same path as /v1/chat/completions."""
    return {"prompt": render_conversation(model.template, body, chat_options(state.settings))}
