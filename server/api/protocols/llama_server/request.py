"""The request bodies of llama-server's own endpoints.

`POST /completion`: `prompt` (text or token ids), `n_predict` (-1: until end of generation or the
context is full), `stream`, `cache_prompt`, `grammar`, `json_schema`, `return_tokens`, and the
sampling fields shared with /v1/completions (temperature, top_k, top_p, min_p, seed, stop,
penalties, `logit_bias` as a map or llama-server's [[token, bias], ...] list). It runs as the
text completion `as_completion` translates it into.

`cache_prompt` is accepted and has no effect: Arbor always reuses what it has cached, and a reuse
never changes the result (docs/architecture.md, "Rules the code keeps"). `id_slot` is accepted and
ignored (the scheduler places requests). `n_probs` > 0 asks for `completion_probabilities`
(server.api.protocols.llama_server.reply).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from server.api.engine_bridge.chat_request import ChatCompletionRequest
from server.api.engine_bridge.completion_request import CompletionRequest
from server.api.engine_bridge.sampling_fields import SamplingFields
from server.api.http.errors import invalid
from server.engine.logprobs import MAX_TOP_LOGPROBS


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


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow")


class TokenizeRequest(_Lenient):
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(_Lenient):
    tokens: list[int]


class ApplyTemplateRequest(ChatCompletionRequest):
    """llama-server's /apply-template takes a whole chat request and returns its prompt."""
