"""Tools for a model whose chat template knows none (SmolLM2's is one).

llama.cpp's chat layer renders such a template without the tools and gives the reply no tool
format. Arbor keeps those models agents: the tools are described in the system message the
Hermes way and earlier calls and results are written as <tool_call> / <tool_response> blocks,
rendered by the model's own template; the reply's grammar and parser are the ones llama.cpp
derives from Arbor's Hermes template (templates/hermes-tools.jinja), so the reply is constrained
and read by llama.cpp's code, not a Python copy.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

TEMPLATE_PATH = Path(__file__).parent / "templates" / "hermes-tools.jinja"

_PREAMBLE = (
    "You may call one or more functions to assist with the user query.\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    "{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call>"
)


@cache
def template_source() -> str:
    return TEMPLATE_PATH.read_text()


def _call_block(call: dict[str, Any]) -> str:
    fn = call["function"]
    args = json.loads(fn["arguments"] or "{}") if isinstance(fn["arguments"], str) else fn["arguments"]
    return f"<tool_call>\n{json.dumps({'name': fn['name'], 'arguments': args})}\n</tool_call>"


def inject_tools(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation as plain messages a tool-less template renders: the tools in the system
    message, calls as <tool_call> blocks in the assistant's text, results as <tool_response>."""
    out = []
    for m in messages:
        d = dict(m)
        if d.get("tool_calls"):
            blocks = [_call_block(c) for c in d.pop("tool_calls")]
            d["content"] = "\n".join(([d["content"]] if d.get("content") else []) + blocks)
        if d["role"] == "tool":
            d["content"] = f"<tool_response>\n{d['content']}\n</tool_response>"
            d.pop("tool_call_id", None)
        if d["role"] == "developer":
            d["role"] = "system"
        out.append(d)
    if not tools:
        return out
    listing = "\n".join(json.dumps(t, separators=(", ", ": ")) for t in tools)
    preamble = _PREAMBLE.format(tools=listing)
    if out and out[0]["role"] == "system":
        return [dict(out[0], content=out[0]["content"] + "\n\n" + preamble)] + out[1:]
    return [{"role": "system", "content": preamble}] + out
