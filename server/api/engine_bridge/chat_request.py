"""The chat request the engine bridge renders (prompting.prepare_chat): OpenAI's Chat Completions
body (`POST /v1/chat/completions`), validated with clear messages. The Responses and Messages
APIs translate their bodies into it (server.api.protocols.openai_responses.translate,
server.api.protocols.anthropic_messages.translate); OpenAI chat's own body is it as sent.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from server.api.engine_bridge.sampling_fields import SamplingFields
from server.engine.logprobs import MAX_TOP_LOGPROBS

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


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    # a final assistant message is continued unless continue_final_message is false (engine_bridge.conversation)
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
