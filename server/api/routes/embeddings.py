"""POST /v1/embeddings (and /embeddings): OpenAI's embeddings API over server.engine.embedder.

Inputs: a string, a list of strings, a list of token ids, or a list of such lists; the
answer's vectors are L2-normalised floats, or base64 of little-endian float32 (the
openai client asks for base64 by default). Each input is embedded as one job on the
engine thread, so running generations advance between inputs; the embeddings context is
separate and leaves their KV alone. A server without an embeddings context answers 501
with the reason (started without --embeddings, or the model has no pooling).

At most --max-embeddings-inputs inputs per request (400 beyond); a client that goes away stops
the work before the next input (499).
"""

from __future__ import annotations

import asyncio
import base64
import struct
from typing import Any, Literal

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from server.api.engine_bridge.prompting import check_model_name
from server.api.http.client_watch import ClientWatch
from server.api.http.deps import ModelDep, StateDep, require_api_key
from server.api.http.errors import APIError, invalid
from server.bootstrap import LoadedModel

router = APIRouter(dependencies=[Depends(require_api_key)])


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # clients send `user` and more

    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)


def raw_inputs(body: EmbeddingRequest, max_inputs: int) -> list[Any]:
    """The request's inputs as a list (one string or one token list is one input); 400 for none
    or more than `max_inputs`, naming --max-embeddings-inputs."""
    raw: list[Any] = [body.input] if isinstance(body.input, str) or (
        body.input and isinstance(body.input[0], int)) else list(body.input)
    if not raw:
        raise invalid("input must hold at least one item", param="input")
    if len(raw) > max_inputs:
        raise APIError(f"input: {len(raw)} inputs; this server embeds at most {max_inputs} per request "
                       "(--max-embeddings-inputs)", param="input", code="too_many_inputs")
    return raw


def _token_inputs(body: EmbeddingRequest, model: LoadedModel, max_inputs: int) -> list[list[int]]:
    raw = raw_inputs(body, max_inputs)
    assert model.embedder is not None  # the route answers 501 without one first
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
async def embeddings(body: EmbeddingRequest, request: Request, state: StateDep, model: ModelDep):
    check_model_name(body.model, model, state.settings)
    embedder = model.embedder
    if embedder is None:
        raise APIError(f"embeddings are not available: {model.embeddings_note}", status=501,
                       type="not_supported_error", code="embeddings_unavailable")
    if body.dimensions is not None and body.dimensions != embedder.n_embd:
        raise invalid(f"this model embeds in {embedder.n_embd} dimensions; dimensions cannot change that",
                      param="dimensions")
    inputs = _token_inputs(body, model, state.settings.max_embeddings_inputs)
    data = []
    async with ClientWatch(request) as watch:
        for i, tokens in enumerate(inputs):
            if watch.gone:  # nobody reads the answer: leave the engine thread to the others
                return APIError("client disconnected", status=499).response()
            vec = await asyncio.to_thread(model.engine.run_exclusive, lambda t=tokens: embedder.embed(t))
            data.append({"object": "embedding", "index": i, "embedding": _encode(vec, body.encoding_format)})
    n = sum(len(t) for t in inputs)
    return {"object": "list", "data": data, "model": model.model_name,
            "usage": {"prompt_tokens": n, "total_tokens": n}}
