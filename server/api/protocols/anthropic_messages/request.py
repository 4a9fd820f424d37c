"""Request bodies of the Messages API, validated with Anthropic's field names.

Top-level fields this server does not act on (`metadata`, `service_tier`, beta fields) are
accepted and ignored, as the chat routes do. Content blocks are strict: a block type the
server cannot render (`image`, `document`, server tools' blocks, an unknown type) is a 400 that
names it, never silently dropped, since the model would answer a different conversation.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from server.api.engine_bridge.chat_request import FunctionDef
from server.api.engine_bridge.sampling_fields import CacheSalt
from server.api.http.errors import invalid


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow")


class CacheControl(_Lenient):
    """A breakpoint: the prefix up to and including its block is worth keeping (`ttl` is
    accepted; how long it is kept is the cache's eviction policy, not a timer)."""

    type: Literal["ephemeral"]
    ttl: str | None = None


class _Block(_Lenient):
    cache_control: CacheControl | None = None


class TextBlock(_Block):
    type: Literal["text"]
    text: str


class _Unsupported(_Block):
    """A block type a text-only chat template cannot render: refused with its reason."""

    reason: str = ""

    @model_validator(mode="after")
    def _refuse(self):
        raise ValueError(self.reason)


class ImageBlock(_Unsupported):
    type: Literal["image"]
    reason: str = "image content blocks are not supported: this server serves a text-only model"


class DocumentBlock(_Unsupported):
    type: Literal["document"]
    reason: str = "document content blocks are not supported: send the document's text in a text block"


class ToolUseBlock(_Block):
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any]


ToolResultContent = Annotated[TextBlock | ImageBlock | DocumentBlock, Field(discriminator="type")]


class ToolResultBlock(_Block):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[ToolResultContent] | None = None
    is_error: bool = False

    def text(self) -> str:
        """The result as the tool message's text; an error result says so first (chat templates
        have no error flag)."""
        if self.content is None:
            body = ""
        elif isinstance(self.content, str):
            body = self.content
        else:
            body = "\n".join(b.text for b in self.content if isinstance(b, TextBlock))
        return f"Error: {body}" if self.is_error else body


class ThinkingBlock(_Block):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None  # Anthropic's proof of origin: accepted, not checked


class RedactedThinkingBlock(_Block):
    type: Literal["redacted_thinking"]
    data: str = ""


ContentBlock = Annotated[
    TextBlock | ImageBlock | DocumentBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock,
    Field(discriminator="type"),
]


class MessageParam(_Lenient):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]

    @model_validator(mode="after")
    def _blocks_fit_the_role(self):
        if isinstance(self.content, list):
            for j, block in enumerate(self.content):
                if self.role == "user" and isinstance(block, ToolUseBlock | ThinkingBlock | RedactedThinkingBlock):
                    raise ValueError(f"content.{j}: a '{block.type}' block belongs in an assistant message")
                if self.role == "assistant" and isinstance(block, ToolResultBlock):
                    raise ValueError(f"content.{j}: a 'tool_result' block belongs in a user message")
        return self


class ToolParam(_Lenient):
    """A client tool: its name and the JSON Schema of its input. Anthropic's server tools
    (`bash_…`, `web_search_…`, `text_editor_…`) run on Anthropic's side and are refused."""

    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any]
    type: str | None = None
    cache_control: CacheControl | None = None

    @model_validator(mode="before")
    @classmethod
    def _client_tool(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("type") not in (None, "custom"):
            raise ValueError(f"tool type '{data['type']}' is not supported: only client tools with an input_schema "
                             "(type 'custom' or no type)")
        return data

    @model_validator(mode="after")
    def _usable_schema(self):
        try:  # the same rules as a chat request's function tools (an object schema, known required names)
            FunctionDef(name=self.name, description=self.description, parameters=self.input_schema)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise ValueError(str(first.get("msg", "invalid tool")).removeprefix("Value error, ")) from None
        return self


class _Choice(_Lenient):
    disable_parallel_tool_use: bool = False


class ToolChoiceAuto(_Choice):
    type: Literal["auto"]


class ToolChoiceAny(_Choice):
    type: Literal["any"]


class ToolChoiceTool(_Choice):
    type: Literal["tool"]
    name: str = Field(min_length=1)


class ToolChoiceNone(_Lenient):
    type: Literal["none"]


ToolChoice = Annotated[ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone, Field(discriminator="type")]


class ThinkingEnabled(_Lenient):
    type: Literal["enabled"]
    budget_tokens: int = Field(ge=0)  # Anthropic asks >= 1024; small local budgets are allowed here


class ThinkingDisabled(_Lenient):
    type: Literal["disabled"]


class ThinkingAdaptive(_Lenient):
    type: Literal["adaptive"]


ThinkingConfig = Annotated[ThinkingEnabled | ThinkingDisabled | ThinkingAdaptive, Field(discriminator="type")]


class Metadata(_Lenient):
    user_id: str | None = None  # accepted; the server keeps no per-user state


class JSONOutputFormat(_Lenient):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Lenient):
    format: JSONOutputFormat | None = None  # structured output: the reply is constrained to the schema
    effort: str | None = None  # accepted; a local model has no effort setting


class PromptFields(_Lenient):
    """What renders the prompt: shared by a message request and a token count."""

    model: str = Field(min_length=1)
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    cache_control: CacheControl | None = None  # a breakpoint on the last block of the prompt

    @model_validator(mode="after")
    def _tool_choice_names_a_tool(self):
        names = [t.name for t in self.tools or []]
        if len(set(names)) != len(names):
            raise ValueError("tools: tool names must be unique")
        if isinstance(self.tool_choice, ToolChoiceTool) and self.tool_choice.name not in names:
            raise ValueError(f"tool_choice: names '{self.tool_choice.name}', which is not in tools")
        if isinstance(self.tool_choice, ToolChoiceAny | ToolChoiceTool) and not names:
            raise ValueError(f"tool_choice: '{self.tool_choice.type}' needs at least one tool")
        return self


class MessagesRequest(PromptFields):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    metadata: Metadata | None = None
    output_config: OutputConfig | None = None
    cache: Any = None  # Arbor's lifecycle hint (docs/server.md); wins over cache_control breakpoints
    cache_salt: CacheSalt = None  # Arbor's extension (vLLM's field): cache isolation, docs/server.md

    @field_validator("stop_sequences")
    @classmethod
    def _non_empty(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and any(not s for s in v):
            raise ValueError("stop sequences must be non-empty")
        return v


class CountTokensRequest(PromptFields):
    """`POST /v1/messages/count_tokens`: the prompt fields alone."""


def _location(loc: tuple) -> str:
    """A validation error's place in Anthropic's dotted form, without pydantic's union labels
    (`list[...]`, `function-after[...]`)."""
    return ".".join(str(p) for p in loc if "[" not in str(p))


T = TypeVar("T", bound=BaseModel)


def parse_request(cls: type[T], raw: Any) -> T:
    """`raw` (decoded JSON) validated as `cls`; a 400 naming the first bad field otherwise."""
    if not isinstance(raw, dict):
        raise invalid("the request body must be a JSON object")
    try:
        return cls.model_validate(raw)
    except ValidationError as exc:
        # the most specific error: a `str | list[block]` field fails both ways, and the block's
        # own complaint (deeper) says more than "not a string"
        first = max(exc.errors(), key=lambda e: (len(_location(tuple(e.get("loc", ()))).split(".")),
                                                 e.get("type") != "string_type"))
        where = _location(tuple(first.get("loc", ())))
        msg = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
        if first.get("type") == "missing":
            msg = "Field required"
        raise invalid(f"{where}: {msg}" if where else msg, param=where or None) from None
