"""The sampling and cache fields of the chat and completion requests the engine bridge runs
(OpenAI's names, which llama-server's native /completion shares), validated with clear messages.

Unknown fields are accepted and ignored (clients send many), but every field acted on is
range-checked here, so the engine only ever sees valid values.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from server.api.http.cache_fields import MAX_SESSION_LEN

MAX_CACHE_SALT = 1024  # characters of a cache_salt (vLLM's field: cache isolation, docs/server.md)

# vLLM's `cache_salt`: requests with different salts (or one without) never share KV
CacheSalt = Annotated[str | None, Field(min_length=1, max_length=MAX_CACHE_SALT)]


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(_Lenient):
    include_usage: bool = False


MAX_DRAFT = 1024  # llama-server's n-gram sizes go up to this; a larger speculative.n_max is a 400


class SpeculativeFields(_Lenient):
    """llama-server's per-request speculative decoding fields, as an object (`"speculative": {"n_max": 8}`)."""

    n_max: int | None = Field(None, ge=0, le=MAX_DRAFT)
    n_min: int | None = Field(None, ge=0, le=MAX_DRAFT)
    p_min: float | None = Field(None, ge=0.0, le=1.0)


class SamplingFields(_Lenient):
    """Fields shared by chat and text completions."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(0.8, ge=0.0, le=2.0)
    top_p: float = Field(0.95, gt=0.0, le=1.0)
    top_k: int = Field(40, ge=0)
    min_p: float = Field(0.05, ge=0.0, le=1.0)
    seed: int | None = None
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    repeat_penalty: float = Field(1.0, gt=0.0, le=10.0)
    repeat_last_n: int = Field(64, ge=0, le=4096)
    logit_bias: dict[str, float] | None = None
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1)  # the upper limit is --max-choices (engine_bridge.prompting)
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    cache: Any = None  # Arbor's lifecycle hint; validated by server.api.http.cache_fields
    # OpenAI's cache hint: the request's cache session, as cache.session (which wins when both are given)
    prompt_cache_key: str | None = Field(None, min_length=1, max_length=MAX_SESSION_LEN)
    cache_salt: CacheSalt = None  # cache isolation: requests with another salt (or none) share no KV
    grammar: str | None = None  # llama-server's GBNF constraint (root rule "root"); checked by engine_bridge.grammars
    json_schema: dict[str, Any] | None = None  # llama-server's shorthand for a JSON-schema constraint
    # speculative decoding, llama-server's names: "speculative.n_max" (0: this request drafts nothing),
    # "speculative.n_min", "speculative.p_min"; or the same as an object, "speculative": {...}
    speculative: SpeculativeFields | None = None
    speculative_n_max: int | None = Field(None, alias="speculative.n_max", ge=0, le=MAX_DRAFT)
    speculative_n_min: int | None = Field(None, alias="speculative.n_min", ge=0, le=MAX_DRAFT)
    speculative_p_min: float | None = Field(None, alias="speculative.p_min", ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _speculative(self):
        nested = self.speculative or SpeculativeFields()
        for name in ("n_max", "n_min", "p_min"):
            flat = getattr(self, f"speculative_{name}")
            if flat is None:
                setattr(self, f"speculative_{name}", getattr(nested, name))
        lo, hi = self.speculative_n_min, self.speculative_n_max
        if lo is not None and hi is not None and 0 < hi < lo:
            raise ValueError(f"speculative.n_min ({lo}) is above speculative.n_max ({hi})")
        return self

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        stops = [v] if isinstance(v, str) else (v or [])  # how many: --max-stop (request_guard)
        if any(not isinstance(s, str) or not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        return stops

    @field_validator("prompt_cache_key")
    @classmethod
    def _printable_key(cls, v: str | None) -> str | None:
        if v is not None and not v.isprintable():
            raise ValueError("prompt_cache_key must not contain control characters")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v):
        if v is None:
            return v
        for k, b in v.items():
            if not k.lstrip("-").isdigit():
                raise ValueError(f"logit_bias keys must be token ids, got '{k}'")
            if not -100.0 <= b <= 100.0:
                raise ValueError("logit_bias values must be between -100 and 100")
        return v
