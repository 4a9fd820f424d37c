"""Rendering chat messages to a prompt with the model's own template.

The template comes from the GGUF metadata (or --chat-template-file) and is rendered by
llama-cpp-python's Jinja2ChatFormatter in an ImmutableSandboxedEnvironment, so a template
cannot reach Python internals. Templates that know nothing of tools (SmolLM2's is one) get
the tools described in the system message in the Hermes format, assistant tool calls
rendered as <tool_call> blocks and tool results as <tool_response> blocks, which is what
such models were tuned on when they were tuned on tools at all.
"""

from __future__ import annotations

import json
from typing import Any

from jinja2 import TemplateError
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from server.api.errors import invalid
from server.api.grammars import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from server.api.schemas import ChatMessage, Tool

# ChatML, for models whose GGUF carries no template.
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_TOOLS_PREAMBLE = (
    "You may call one or more functions to assist with the user query.\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call>"
)


def _arguments_obj(arguments: str | dict[str, Any]) -> dict[str, Any]:
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments or "{}")
    except json.JSONDecodeError as exc:
        raise invalid(f"tool call arguments are not valid JSON: {exc}", param="messages") from exc
    if not isinstance(value, dict):
        raise invalid("tool call arguments must be a JSON object", param="messages")
    return value


class ChatTemplate:
    def __init__(self, source: str | None, *, bos_token: str, eos_token: str):
        self.source = source or CHATML_TEMPLATE
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.native_tools = "tools" in self.source and "tool_call" in self.source
        try:
            # one per value of add_generation_prompt (the formatter fixes it at construction)
            self._formatters = {
                gen: Jinja2ChatFormatter(self.source, eos_token=eos_token, bos_token=bos_token,
                                         add_generation_prompt=gen)
                for gen in (True, False)
            }
        except TemplateError as exc:
            raise ValueError(f"the chat template does not parse: {exc}") from exc

    def render(self, messages: list[ChatMessage], tools: list[Tool] | None = None, *,
               add_generation_prompt: bool = True) -> str:
        """The prompt text, ending with the assistant generation prompt (unless told not to)."""
        tool_dicts = [t.model_dump(exclude_none=True) for t in tools or []]
        dicts = [self._message_dict(m) for m in messages]
        if tool_dicts and not self.native_tools:
            dicts = self._inject_tools(dicts, tool_dicts)
        try:
            result = self._formatters[add_generation_prompt](messages=dicts, tools=tool_dicts or None)
        except (TemplateError, ValueError, TypeError, KeyError) as exc:
            raise invalid(f"the chat template could not render these messages: {exc}", param="messages") from exc
        return result.prompt

    def _message_dict(self, m: ChatMessage) -> dict[str, Any]:
        d: dict[str, Any] = {"role": m.role, "content": m.text()}
        if m.name:
            d["name"] = m.name
        if m.tool_call_id:
            d["tool_call_id"] = m.tool_call_id
        if m.tool_calls:
            calls = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.function.name, "arguments": _arguments_obj(c.function.arguments)}}
                for c in m.tool_calls
            ]
            if self.native_tools:
                d["tool_calls"] = calls
            else:
                blocks = [
                    f"{TOOL_CALL_OPEN}\n{json.dumps({'name': c['function']['name'], 'arguments': c['function']['arguments']})}\n{TOOL_CALL_CLOSE}"
                    for c in calls
                ]
                d["content"] = "\n".join(([d["content"]] if d["content"] else []) + blocks)
        if m.role == "tool" and not self.native_tools:
            d["content"] = f"<tool_response>\n{d['content']}\n</tool_response>"
        if m.role == "developer" and not self.native_tools:
            d["role"] = "system"
        return d

    def _inject_tools(self, dicts: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
        listing = "\n".join(json.dumps(t, separators=(", ", ": ")) for t in tools)
        preamble = _TOOLS_PREAMBLE.format(tools=listing)
        if dicts and dicts[0]["role"] == "system":
            first = dict(dicts[0], content=dicts[0]["content"] + "\n\n" + preamble)
            return [first] + dicts[1:]
        return [{"role": "system", "content": preamble}] + dicts
