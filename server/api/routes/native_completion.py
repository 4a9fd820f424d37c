"""POST /completion: llama-server's native completion endpoint.

Request: `prompt` (text or token ids), `n_predict` (-1: until end of generation or the
context is full), `stream`, `cache_prompt`, `grammar`, `json_schema`, `return_tokens`, and
the sampling fields shared with /v1/completions (temperature, top_k, top_p, min_p, seed,
stop, penalties, `logit_bias` as a map or llama-server's [[token, bias], ...] list).
Answer: `content`, `stop`, `stop_type` (eos | word | limit), `stopping_word`,
`tokens_predicted`, `tokens_evaluated`, `tokens_cached`, `timings`, `truncated`, `model`;
streamed as `data: {...}` events of the same shape (no `[DONE]`, as llama-server).

`cache_prompt` is accepted and has no effect: Arbor always reuses what it has cached, and
a reuse never changes the result (DESIGN.md). `id_slot` is accepted and ignored (the
scheduler places requests). `n_probs` > 0 adds `completion_probabilities` (each generated
token's log-probability and the n_probs most likely tokens, as llama-server reports them
with `post_sampling_probs` off: from the model's distribution before sampling).
"""

from __future__ import annotations

import functools
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse
from pydantic import Field, field_validator

from server.api import responses as R
from server.api.engine_bridge.generation import Generation, engine_error
from server.api.engine_bridge.prompting import prepare_completion
from server.api.http.client_watch import ClientWatch
from server.api.http.deps import ModelDep, StateDep, require_api_key
from server.api.http.errors import APIError, invalid
from server.api.protocols.logprob_format import native_probabilities
from server.api.schemas import CompletionRequest, SamplingFields
from server.engine.logprobs import MAX_TOP_LOGPROBS
from server.engine.sequence import Finished

router = APIRouter(dependencies=[Depends(require_api_key)])


class NativeCompletionRequest(SamplingFields):
    prompt: str | list[int]
    n_predict: int = Field(-1, ge=-1)
    cache_prompt: bool = True
    return_tokens: bool = False
    n_probs: int = Field(0, ge=0, le=MAX_TOP_LOGPROBS)

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _pairs(cls, v):
        """llama-server also takes [[token, bias], ...]."""
        if isinstance(v, list):
            if not all(isinstance(p, list) and len(p) == 2 and isinstance(p[1], int | float) for p in v):
                raise ValueError("logit_bias as a list holds [token_id, bias] pairs")
            return {str(tok): float(bias) for tok, bias in v}
        return v

    def as_completion(self) -> CompletionRequest:
        if self.n != 1:
            raise invalid("/completion samples one answer; use /v1/completions for n > 1", param="n")
        if self.n_predict == 0:
            raise invalid("n_predict must be -1 (no limit) or at least 1", param="n_predict")
        fields = self.model_dump(exclude={"n_predict", "cache_prompt", "return_tokens", "n_probs"})
        fields["max_tokens"] = self.n_predict if self.n_predict > 0 else self.max_tokens
        fields["logprobs"] = self.n_probs or None
        return CompletionRequest.model_validate(fields)


def _stop_type(fin: Finished) -> str:
    if fin.finish_reason == "length":
        return "limit"
    return "word" if fin.stop_word else "eos"


def _final(name: str, content: str, tokens: list[int] | None, prompt: str | None, fin: Finished) -> dict[str, Any]:
    return {
        "index": 0,
        "content": content,
        "tokens": tokens or [],
        "id_slot": -1,
        "stop": True,
        "model": name,
        "prompt": prompt or "",
        "tokens_predicted": fin.completion_tokens,
        "tokens_evaluated": fin.prompt_tokens,
        "tokens_cached": fin.prompt_tokens + fin.completion_tokens,
        "has_new_line": "\n" in content,
        "truncated": False,
        "stop_type": _stop_type(fin),
        "stopping_word": fin.stop_word or "",
        "timings": R.timings(fin),
        "arbor": R.arbor_extension(fin),
    }


@router.post("/completion")
async def completion(body: NativeCompletionRequest, request: Request, state: StateDep, model: ModelDep):
    prepared = prepare_completion(body.as_completion(), model, state.settings, request)
    generation = Generation(model.engine, prepared.generation, state.metrics)
    name, n_prompt = model.model_name, len(prepared.generation.prompt_tokens)
    piece = functools.partial(model.runtime.piece, special=True) if body.n_probs else None

    if not body.stream:
        async with ClientWatch(request) as watch:
            got = await generation.collect(watch)
        if got is None:
            return APIError("client disconnected", status=499).response()
        final = _final(name, got.text, got.tokens if body.return_tokens else None, prepared.prompt_text, got.fin)
        if piece is not None:
            final["completion_probabilities"] = native_probabilities(got.logprobs, piece)
        return final

    async def stream():
        n_predicted = 0
        async for ev in generation.events():
            if isinstance(ev, Finished):
                if ev.finish_reason == "error":
                    yield R.error_event(engine_error(ev))
                else:
                    yield R.sse(_final(name, "", None, prepared.prompt_text, ev))
                return
            n_predicted += len(ev.tokens)
            chunk = {"index": 0, "content": ev.text, "tokens": list(ev.tokens) if body.return_tokens else [],
                     "stop": False, "id_slot": -1, "tokens_predicted": n_predicted, "tokens_evaluated": n_prompt}
            if piece is not None:
                chunk["completion_probabilities"] = native_probabilities(ev.logprobs, piece)
            yield R.sse(chunk)

    return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
