"""The request body of `POST /v1/responses`, validated with clear messages.

Unknown fields are accepted and ignored (clients send many: `include`, `truncation`,
`service_tier`, ...), but every field acted on is checked here, and what this server cannot do
(non-function tools, images and files, background runs, server-side conversations) is a 400
naming the field rather than a silently different answer.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

from server.api.engine_bridge.chat_request import FunctionDef
from server.api.engine_bridge.sampling_fields import CacheSalt
from server.api.http.cache_fields import MAX_SESSION_LEN


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow")


# content part types that carry text, by role: what a client may replay of an earlier answer
# (output_text, refusal) and what it writes itself (input_text; "text" as some clients send)
_TEXT_PARTS = {"input_text": "text", "output_text": "text", "text": "text", "refusal": "refusal"}


def _part_texts(parts: list[dict[str, Any]], what: str) -> list[dict[str, Any]]:
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        key = _TEXT_PARTS.get(kind) if isinstance(kind, str) else None
        if key is None:
            raise ValueError(f"{what}[{j}]: content part type {kind!r} is not supported; this server reads text "
                             f"parts only ({', '.join(_TEXT_PARTS)})")
        if not isinstance(part.get(key), str):
            raise ValueError(f"{what}[{j}]: a '{kind}' part needs a string '{key}'")
    return parts


def parts_text(content: str | list[dict[str, Any]]) -> str:
    if isinstance(content, str):
        return content
    return "".join(p[_TEXT_PARTS[p["type"]]] for p in content)


class MessageItem(_Lenient):
    """A message: `{"role", "content"}` (the easy form) or `{"type": "message", ...}`; an
    assistant message is an earlier answer replayed."""

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[dict[str, Any]]
    id: str | None = None
    status: str | None = None

    @field_validator("content")
    @classmethod
    def _text_parts(cls, v: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
        return v if isinstance(v, str) else _part_texts(v, "content")

    def text(self) -> str:
        return parts_text(self.content)


class FunctionCallItem(_Lenient):
    """A call the model made (replayed from an earlier answer)."""

    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str = "{}"
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(_Lenient):
    """The client's result of a call; `call_id` names a function_call earlier in the conversation."""

    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[dict[str, Any]]
    id: str | None = None
    status: str | None = None

    @field_validator("output")
    @classmethod
    def _text_parts(cls, v: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
        return v if isinstance(v, str) else _part_texts(v, "output")

    def text(self) -> str:
        return parts_text(self.output)


class ReasoningPart(_Lenient):
    type: Literal["summary_text", "reasoning_text"]
    text: str


class ReasoningItem(_Lenient):
    """An earlier answer's reasoning: the text of its `content` (or else its `summary`) becomes
    the reasoning_content of the assistant turn that follows it."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[ReasoningPart] = Field(default_factory=list)
    content: list[ReasoningPart] | None = None
    encrypted_content: str | None = None
    status: str | None = None

    def text(self) -> str:
        return "".join(p.text for p in (self.content or self.summary))


INPUT_ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")


def _item_type(v: Any) -> str | None:
    kind = v.get("type", "message") if isinstance(v, dict) else getattr(v, "type", None)
    return kind if kind in INPUT_ITEM_TYPES else None


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_item_type, custom_error_type="unsupported_item",
                  custom_error_message=f"unsupported input item type; expected one of {', '.join(INPUT_ITEM_TYPES)}"),
]


class FunctionTool(FunctionDef):
    """Responses' flat function tool: `{"type": "function", "name", "description", "parameters", "strict"}`."""

    type: Literal["function"]

    @model_validator(mode="before")
    @classmethod
    def _function_only(cls, v: Any) -> Any:
        if isinstance(v, dict):
            kind = v.get("type")
            if kind != "function":
                raise ValueError(f"tool type {kind!r} is not supported; this server runs function tools only")
            if v.get("parameters") is None:  # Responses allows null: no parameters
                v = {k: x for k, x in v.items() if k != "parameters"}
        return v


class ToolChoiceFunction(_Lenient):
    type: Literal["function"]
    name: str = Field(min_length=1)


class TextFormat(_Lenient):
    """`text.format`: plain text, any JSON object, or JSON matching `schema` (Responses puts
    the schema's name and body beside `type`, where chat completions nest them)."""

    type: Literal["text", "json_object", "json_schema"]
    name: str = "response"
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None
    description: str | None = None

    @model_validator(mode="after")
    def _schema_given(self):
        if self.type == "json_schema" and self.schema_ is None:
            raise ValueError("text.format.schema is required when type is 'json_schema'")
        return self


class TextConfig(_Lenient):
    format: TextFormat | None = None


class ReasoningConfig(_Lenient):
    effort: str | None = None  # passed to the template as reasoning_effort; "none" turns thinking off
    summary: str | None = None  # accepted; the reasoning comes back whole, as reasoning_text


class ResponsesRequest(_Lenient):
    model: str | None = None
    input: str | list[InputItem] = Field(default_factory=list)
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | ToolChoiceFunction | None = None
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    store: bool = True
    previous_response_id: str | None = Field(None, min_length=1)
    stream: bool = False
    metadata: dict[str, str] | None = None
    prompt_cache_key: str | None = Field(None, min_length=1, max_length=MAX_SESSION_LEN)
    cache_salt: CacheSalt = None  # vLLM's cache isolation, as on chat completions
    background: bool | None = None
    conversation: Any = None
    prompt: Any = None
    # Arbor's and llama-server's own fields, as on chat completions
    cache: Any = None
    seed: int | None = None
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("prompt_cache_key")
    @classmethod
    def _printable(cls, v: str | None) -> str | None:
        if v is not None and not v.isprintable():
            raise ValueError("prompt_cache_key must not contain control characters")
        return v

    @model_validator(mode="after")
    def _consistent(self):
        if self.background:
            raise ValueError("background responses are not supported; send the request and wait, or stream it")
        if self.conversation is not None:
            raise ValueError("conversation is not supported; continue with previous_response_id or send the input")
        if self.prompt is not None:
            raise ValueError("prompt (stored prompt templates) is not supported; send instructions and input")
        if not self.input and self.previous_response_id is None:
            raise ValueError("input must not be empty")
        names = [t.name for t in self.tools or []]
        if len(set(names)) != len(names):
            raise ValueError("tool names must be unique")
        if isinstance(self.tool_choice, ToolChoiceFunction) and self.tool_choice.name not in names:
            raise ValueError(f"tool_choice names '{self.tool_choice.name}', which is not in tools")
        if self.tool_choice == "required" and not names:
            raise ValueError("tool_choice 'required' needs at least one tool")
        return self

    def items(self) -> list[MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem]:
        """The new input as items (a string is one user message)."""
        if isinstance(self.input, str):
            return [MessageItem(role="user", content=self.input)]
        return list(self.input)
