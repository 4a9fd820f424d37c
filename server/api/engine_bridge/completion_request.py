"""The completion request the engine bridge runs (prompting.prepare_completion): OpenAI's (legacy)
text completions body (`POST /v1/completions`), a prompt as text or token ids and the sampling
fields of server.api.engine_bridge.sampling_fields. llama-server's /completion translates its body
into it (server.api.protocols.llama_server.request)."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from server.api.engine_bridge.sampling_fields import SamplingFields
from server.engine.logprobs import MAX_TOP_LOGPROBS


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str]
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)  # alternatives per token (legacy API)

    @model_validator(mode="after")
    def _no_prompt_logprobs(self):
        if self.echo and self.logprobs is not None:
            # would need the prompt's logits, which prefix reuse does not compute
            raise ValueError("logprobs together with echo (log-probabilities of the prompt) is not supported")
        return self

    @property
    def logprobs_k(self) -> int | None:
        return self.logprobs

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v):
        if isinstance(v, list) and v and isinstance(v[0], str):
            if len(v) != 1:
                raise ValueError("only one prompt per request is supported")
            v = v[0]
        if (isinstance(v, str) and not v) or (isinstance(v, list) and not v):
            raise ValueError("prompt must not be empty")
        return v
