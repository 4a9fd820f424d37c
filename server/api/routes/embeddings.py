"""POST /v1/embeddings (and /embeddings): OpenAI's embeddings API over server.engine.embedder.

Inputs: a string, a list of strings, a list of token ids, or a list of such lists; the
answer's vectors are L2-normalised floats, or base64 of little-endian float32 (the
openai client asks for base64 by default). Each input is embedded as one job on the
engine thread, so running generations advance between inputs; the embeddings context is
separate and leaves their KV alone. A server without an embeddings context answers 501
with the reason (started without --embeddings, or the model has no pooling).
"""

from __future__ import annotations

import asyncio
import base64
import struct
from typing import Any, Literal

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field

from server.api.deps import ModelDep, StateDep, require_api_key
from server.api.errors import APIError, invalid
from server.api.prompting import check_model_name
from server.bootstrap import LoadedModel

router = APIRouter(dependencies=[Depends(require_api_key)])

MAX_INPUTS = 256


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # clients send `user` and more

    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)


def _token_inputs(body: EmbeddingRequest, model: LoadedModel) -> list[list[int]]:
    raw: list[Any] = [body.input] if isinstance(body.input, str) or (
        body.input and isinstance(body.input[0], int)) else list(body.input)
    if not raw or len(raw) > MAX_INPUTS:
        raise invalid(f"input must hold 1..{MAX_INPUTS} items", param="input")
    rt, limit = model.runtime, model.embedder.n_ctx
    out = []
    for i, item in enumerate(raw):
        if isinstance(item, str):
            tokens = rt.tokenize(item, add_special=True, parse_special=True) if item else []
        else:
            if any(not 0 <= t < rt.info.n_vocab for t in item):
                raise invalid(f"input[{i}]: token ids must be in 0..{rt.info.n_vocab - 1}", param="input")
            tokens = list(item)
        if not 0 < len(tokens) <= limit:
            raise invalid(f"input[{i}] has {len(tokens)} tokens; an input needs 1..{limit} "
                          f"(--embeddings-ctx)", param="input")
        out.append(tokens)
    return out


def _encode(vec: list[float], fmt: str) -> list[float] | str:
    if fmt == "float":
        return vec
    return base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode()


@router.post("/v1/embeddings")
async def embeddings(body: EmbeddingRequest, state: StateDep, model: ModelDep):
    check_model_name(body.model, model, state.settings)
    embedder = model.embedder
    if embedder is None:
        raise APIError(f"embeddings are not available: {model.embeddings_note}", status=501,
                       type="not_supported_error", code="embeddings_unavailable")
    if body.dimensions is not None and body.dimensions != embedder.n_embd:
        raise invalid(f"this model embeds in {embedder.n_embd} dimensions; dimensions cannot change that",
                      param="dimensions")
    inputs = _token_inputs(body, model)
    data = []
    for i, tokens in enumerate(inputs):
        vec = await asyncio.to_thread(model.engine.run_exclusive, lambda t=tokens: embedder.embed(t))
        data.append({"object": "embedding", "index": i, "embedding": _encode(vec, body.encoding_format)})
    n = sum(len(t) for t in inputs)
    return {"object": "list", "data": data, "model": model.model_name,
            "usage": {"prompt_tokens": n, "total_tokens": n}}
