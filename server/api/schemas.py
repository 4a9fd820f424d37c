"""Request bodies of the OpenAI-compatible routes, validated with clear messages.

Unknown fields are accepted and ignored (clients send many), but every field we act on is
range-checked here, so the engine only ever sees valid values.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from server.cache.lifecycle import MAX_SESSION_LEN
from server.engine.logprobs import MAX_TOP_LOGPROBS

MAX_CACHE_SALT = 1024  # characters of a cache_salt (vLLM's field: cache isolation, docs/server.md)

# vLLM's `cache_salt`: requests with different salts (or one without) never share KV
CacheSalt = Annotated[str | None, Field(min_length=1, max_length=MAX_CACHE_SALT)]

ROLES = ("system", "developer", "user", "assistant", "tool", "function")


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow")


class FunctionCall(_Lenient):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(_Lenient):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Lenient):
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None  # an earlier reply's reasoning; the template decides what to keep

    @field_validator("role")
    @classmethod
    def _known_role(cls, v: str) -> str:
        if v not in ROLES:
            raise ValueError(f"unknown role '{v}'; expected one of {', '.join(ROLES)}")
        return v

    @model_validator(mode="after")
    def _has_content(self):
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a '{self.role}' message needs content")
        if isinstance(self.content, list):
            for part in self.content:
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ValueError("only text content parts ({'type': 'text', 'text': ...}) are supported")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p["text"] for p in self.content)


class FunctionDef(_Lenient):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _object_schema(cls, v: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(v, dict) or v.get("type", "object") != "object":
            raise ValueError("function parameters must be a JSON Schema of type 'object'")
        props = v.get("properties", {})
        if not isinstance(props, dict) or not all(isinstance(p, dict) for p in props.values()):
            raise ValueError("function parameters.properties must map names to JSON Schemas")
        required = v.get("required", [])
        if not isinstance(required, list) or any(r not in props for r in required):
            raise ValueError("function parameters.required must list names defined in properties")
        return v


class Tool(_Lenient):
    type: Literal["function"]
    function: FunctionDef


class NamedToolChoice(_Lenient):
    type: Literal["function"]
    function: dict[str, str]

    @field_validator("function")
    @classmethod
    def _has_name(cls, v: dict[str, str]) -> dict[str, str]:
        if not v.get("name"):
            raise ValueError("tool_choice.function.name is required")
        return v


class JSONSchemaFormat(_Lenient):
    name: str = "response"
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Lenient):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self):
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format.json_schema is required when type is 'json_schema'")
        return self


class StreamOptions(_Lenient):
    include_usage: bool = False


class SamplingFields(_Lenient):
    """Fields shared by chat and text completions."""

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
    n: int = Field(1, ge=1)  # the upper limit is --max-choices (api.prompting)
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    cache: Any = None  # Arbor's lifecycle hint; validated by server.cache.lifecycle
    # OpenAI's cache hint: the request's cache session, as cache.session (which wins when both are given)
    prompt_cache_key: str | None = Field(None, min_length=1, max_length=MAX_SESSION_LEN)
    cache_salt: CacheSalt = None  # cache isolation: requests with another salt (or none) share no KV
    grammar: str | None = None  # llama-server's GBNF constraint (root rule "root"); checked by api.grammars
    json_schema: dict[str, Any] | None = None  # llama-server's shorthand for a JSON-schema constraint

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


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    # a final assistant message is continued unless continue_final_message is false (api.conversation)
    continue_final_message: bool | None = None
    add_generation_prompt: bool | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    # llama-server's: how reasoning comes back (none: left in content; auto/deepseek: reasoning_content)
    reasoning_format: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # extra template variables, e.g. enable_thinking
    reasoning_effort: str | None = None  # passed to the template; "none" turns thinking off
    # llama-server's reasoning budget: tokens of reasoning before the end tag is forced (-1: no limit)
    reasoning_budget_tokens: int | None = Field(None, ge=-1)
    thinking_budget_tokens: int | None = Field(None, ge=-1)
    reasoning_budget_message: str | None = Field(None, max_length=1000)

    @model_validator(mode="after")
    def _tool_choice_consistent(self):
        names = {t.function.name for t in self.tools or []}
        if len(names) != len(self.tools or []):
            raise ValueError("tool names must be unique")
        if isinstance(self.tool_choice, NamedToolChoice) and self.tool_choice.function["name"] not in names:
            raise ValueError(f"tool_choice names '{self.tool_choice.function['name']}', which is not in tools")
        if self.tool_choice == "required" and not names:
            raise ValueError("tool_choice 'required' needs at least one tool")
        if self.max_completion_tokens is not None and self.max_tokens is None:
            self.max_tokens = self.max_completion_tokens
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    @property
    def logprobs_k(self) -> int | None:
        """Alternatives to report per token (None: no logprobs)."""
        return (self.top_logprobs or 0) if self.logprobs else None


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


class TokenizeRequest(_Lenient):
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(_Lenient):
    tokens: list[int]


class ApplyTemplateRequest(ChatCompletionRequest):
    """llama-server's /apply-template takes a whole chat request and returns its prompt."""
