"""A deterministic text rendering of an OpenAI request body, for prefix accounting.

Chat templates render tools first and then each message in order, so two requests whose
message lists share a prefix also share a prompt prefix. This rendering keeps that
property without knowing the model's template: it is used to compute the ideal on
word pieces when the server cannot tokenize for us (see ``ideal.py``). It is not the
server's prompt and must not be sent anywhere.
"""

from __future__ import annotations

import json
from typing import Any


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            else:
                parts.append(json.dumps(part, sort_keys=True))
        return " ".join(parts)
    return json.dumps(content, sort_keys=True)


def render_request_text(body: dict) -> str:
    """Render a chat or completions request body as plain text, prefix-preserving."""
    if "messages" not in body:
        prompt = body.get("prompt", "")
        return prompt if isinstance(prompt, str) else json.dumps(prompt)
    pieces: list[str] = []
    tools = body.get("tools")
    if tools:
        pieces.append("<|tools|>\n" + json.dumps(tools, sort_keys=True) + "\n")
    for message in body.get("messages") or []:
        role = message.get("role", "user")
        text = _content_text(message.get("content"))
        if message.get("tool_calls"):
            text += "\n" + json.dumps(message["tool_calls"], sort_keys=True)
        if message.get("tool_call_id"):
            text = f"[{message['tool_call_id']}] " + text
        pieces.append(f"<|{role}|>\n{text}\n")
    return "".join(pieces)
