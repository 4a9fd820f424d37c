"""llama.cpp's own chat layer (common/chat), reached through Arbor's C ABI.

`libarbor-chat` (patches/llama.cpp/0007-arbor-chat-c-abi.patch) is built beside libllama from
the same pinned source. It renders a conversation with llama.cpp's Jinja engine and its
per-family handling (tools described the family's way, tool calls and reasoning in the history),
returns the grammar that constrains the family's tool calls (lazy: it switches on at the family's
trigger) and a parser that reads the family's reasoning, content and tool calls back out of the
reply, exactly as llama-server does. Nothing here knows a family: there is no Python copy of a
template or a parser to drift from llama.cpp.

Contract: every call takes and returns plain data; a failure is a `ChatLayerError` carrying
llama.cpp's own message, never a crash (the C side catches every exception).
"""

from __future__ import annotations

import ctypes
import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from server.engine.chat_library import chat_library, error_text, take_string

REPLY_PLANS_KEPT = 64  # tool sets whose reply plan a ChatTemplates remembers


class ChatLayerError(RuntimeError):
    """llama.cpp's chat layer refused: a template it cannot load or render, a reply it cannot parse."""


def _call_json(fn, *args) -> dict[str, Any]:
    err = ctypes.c_void_p()
    out = take_string(fn(*args, ctypes.byref(err)))
    if out is None:
        raise ChatLayerError(error_text(err, "llama.cpp's chat layer failed without a message"))
    return json.loads(out)


@dataclass(frozen=True)
class ChatPlan:
    """What llama.cpp's chat layer makes of one request: the prompt, how to constrain the reply
    and how to parse it (the fields of common_chat_params, trigger words resolved to tokens)."""

    prompt: str
    format: int
    format_name: str
    grammar: str
    grammar_lazy: bool
    trigger_patterns: tuple[str, ...]
    trigger_tokens: tuple[int, ...]
    preserved_tokens: frozenset[int]
    grammar_prefill_tokens: tuple[int, ...]
    generation_prompt_tokens: tuple[int, ...]
    generation_prompt: str
    additional_stops: tuple[str, ...]
    parser: str
    supports_thinking: bool
    thinking_start_tag: str
    thinking_end_tags: tuple[str, ...]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ChatPlan:
        return cls(
            prompt=d["prompt"], format=int(d["format"]), format_name=d["format_name"], grammar=d["grammar"],
            grammar_lazy=bool(d["grammar_lazy"]), trigger_patterns=tuple(d["trigger_patterns"]),
            trigger_tokens=tuple(d["trigger_tokens"]), preserved_tokens=frozenset(d["preserved_tokens"]),
            grammar_prefill_tokens=tuple(d["grammar_prefill_tokens"]),
            generation_prompt_tokens=tuple(d["generation_prompt_tokens"]), generation_prompt=d["generation_prompt"],
            additional_stops=tuple(d["additional_stops"]), parser=d["parser"],
            supports_thinking=bool(d["supports_thinking"]), thinking_start_tag=d["thinking_start_tag"],
            thinking_end_tags=tuple(d["thinking_end_tags"]),
        )


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text (possibly unfinished while streaming)
    id: str


@dataclass(frozen=True)
class ParsedReply:
    """A reply read by the family's parser: what the model thought, said and called."""

    content: str
    reasoning_content: str
    tool_calls: tuple[ParsedCall, ...]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ParsedReply:
        calls = tuple(ParsedCall(c["function"]["name"], c["function"]["arguments"], c.get("id") or "")
                      for c in d.get("tool_calls", []))
        return cls(d.get("content") or "", d.get("reasoning_content") or "", calls)


EMPTY_REPLY = ParsedReply("", "", ())


class ChatTemplates:
    """The model's chat templates as llama.cpp loads them (or a template's source given instead).
    `apply` only reads the loaded templates; `reply_plan`'s memo is not locked: the API calls it
    from its event loop alone."""

    def __init__(self, model_ptr, template_override: str | None = None):
        lib = chat_library()
        self._lib = lib
        err = ctypes.c_void_p()
        override = template_override.encode() if template_override else None
        self._handle = lib.arbor_chat_templates_init(model_ptr, override, ctypes.byref(err))
        if not self._handle:
            raise ChatLayerError(error_text(err, "llama.cpp could not load the chat template"))
        info = json.loads(take_string(lib.arbor_chat_templates_info(self._handle)) or "{}")
        self.source: str = info.get("source", "")
        self.caps: dict[str, bool] = info.get("caps", {})
        self.supports_thinking: bool = bool(info.get("supports_thinking"))
        # A template that neither lists tools nor writes calls gets Arbor's Hermes tool format
        # (server.api.engine_bridge.tool_fallback); `tool_format` is the templates its grammar and parser come from.
        self.native_tools = bool(self.caps.get("supports_tools") or self.caps.get("supports_tool_calls")
                                 or info.get("tool_use_source"))
        self._model_ptr = model_ptr
        self._tool_format: ChatTemplates | None = None
        self._reply_plans: OrderedDict[str, ChatPlan] = OrderedDict()

    @property
    def tool_format(self) -> ChatTemplates:
        """The templates whose plan constrains and reads a reply with tool calls."""
        if self.native_tools:
            return self
        if self._tool_format is None:
            from server.api.engine_bridge.tool_fallback import template_source
            self._tool_format = ChatTemplates(self._model_ptr, template_source())
        return self._tool_format

    def apply(self, request: dict[str, Any]) -> ChatPlan:
        """Render + plan one request (the JSON arbor_chat_apply takes, see arbor-chat.h)."""
        if not self._handle:
            raise ChatLayerError("the chat templates were closed")
        payload = json.dumps(request, ensure_ascii=False).encode()
        return ChatPlan.from_json(_call_json(self._lib.arbor_chat_apply, self._handle, payload))

    def reply_plan(self, request: dict[str, Any]) -> ChatPlan:
        """The plan of `request` for its reply alone (grammar, triggers, parser; the prompt is
        not the request's): `apply` on a one-message conversation, remembered per tools and
        options. For Arbor's tool format, whose reply format does not depend on the messages;
        an agent sends the same tools every call, so this costs one apply per tool set."""
        key = json.dumps({k: v for k, v in request.items() if k != "messages"}, sort_keys=True)
        plan = self._reply_plans.get(key)
        if plan is None:
            plan = self.apply({**request, "messages": [{"role": "user", "content": "?"}]})
            self._reply_plans[key] = plan
            if len(self._reply_plans) > REPLY_PLANS_KEPT:
                self._reply_plans.popitem(last=False)
        else:
            self._reply_plans.move_to_end(key)
        return plan

    def close(self) -> None:
        if self._handle:
            self._lib.arbor_chat_templates_free(self._handle)
            self._handle = None
        if self._tool_format is not None:
            self._tool_format.close()

    def __del__(self):  # the server holds one for its life; tests make many
        try:
            self.close()
        except Exception:  # noqa: BLE001 - a finalizer must not raise
            pass


class ReplyParser:
    """The family's parser for one reply; `parse` reads the whole text so far. Free with close()."""

    def __init__(self, plan: ChatPlan, *, reasoning_format: str, parse_tool_calls: bool):
        self._lib = chat_library()
        params = {"format": plan.format, "reasoning_format": reasoning_format,
                  "generation_prompt": plan.generation_prompt, "parser": plan.parser,
                  "parse_tool_calls": parse_tool_calls}
        err = ctypes.c_void_p()
        self._handle = self._lib.arbor_chat_parser_init(json.dumps(params).encode(), ctypes.byref(err))
        if not self._handle:
            raise ChatLayerError(error_text(err, "llama.cpp could not load the reply parser"))

    def parse(self, text: str, *, partial: bool) -> ParsedReply:
        if not self._handle:
            raise ChatLayerError("the reply parser was closed")
        return ParsedReply.from_json(_call_json(self._lib.arbor_chat_parse, self._handle,
                                                text.encode("utf-8"), partial))

    def close(self) -> None:
        if self._handle:
            self._lib.arbor_chat_parser_free(self._handle)
            self._handle = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - a finalizer must not raise
            pass
