"""`cache_control` breakpoints: Anthropic's "keep the prefix up to here", as Arbor's cache hint.

Arbor reuses every prefix it still holds, breakpoints or not (a breakpoint never changes what
is computed or answered). What a breakpoint adds is a claim on keeping: the prefix up to the
last breakpoint (in Anthropic's order: tools, system, messages) is worth keeping. Arbor's cache
expresses "keep this" with a lifecycle hint (server.cache.lifecycle): a request whose hint pins
its session publishes its whole prompt as resident KV (tier S) when it ends, and a pinned
session's tree paths are not evicted from host or disk. So a request with breakpoints carries
the hint `{session: "cache_control:<digest of the prefix's tokens>", pin: true}`:

- the session names the prefix, so every request that ends its breakpoint prefix on the same
  tokens renews the same pin instead of adding one, and a moved breakpoint (the next turn of a
  conversation) pins the longer prefix;
- pins are bounded as every pin is (--cache-max-pinned-sessions, --cache-max-pinned-mb: the
  oldest pins are released first) and a pin is forgotten --cache-session-idle seconds after its
  last request: that plays the part of Anthropic's TTL (`ttl` is accepted, not a timer);
- a request that sends Arbor's own hint (the `cache` field or the X-Arbor-* headers) keeps it:
  the client said what it wants, and the breakpoints add nothing to it.

Usage: `cache_read_input_tokens` are the prompt tokens reused; `cache_creation_input_tokens` the
tokens of the breakpoint prefix this request computed (0 without breakpoints);
`input_tokens` the rest of the prompt, so the three add up to the prompt as Anthropic's do.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from server.api.engine_bridge.conversation import plan_conversation
from server.api.engine_bridge.prompting import chat_options, templates, tokenize_prompt
from server.api.http.errors import APIError
from server.api.protocols.anthropic_messages.request import MessageParam, PromptFields, ToolResultBlock
from server.api.protocols.anthropic_messages.translate import prefix_request
from server.bootstrap import LoadedModel
from server.cache.lifecycle import CacheHint
from server.engine.slots import common_prefix_len
from server.settings import ServerSettings

SESSION_PREFIX = "cache_control:"


@dataclass(frozen=True)
class Breakpoint:
    """The last block marked with `cache_control`: in `tools` or `system` (`index`), block
    `block` of message `message`, or the prompt's end (the request's top-level `cache_control`)."""

    section: str  # "tools" | "system" | "messages" | "end"
    index: int = 0
    message: int = 0
    block: int = 0


def _marked(block) -> bool:
    if block.cache_control is not None:
        return True
    content = block.content if isinstance(block, ToolResultBlock) else None
    return isinstance(content, list) and any(b.cache_control is not None for b in content)


def last_breakpoint(body: PromptFields) -> Breakpoint | None:
    if body.cache_control is not None:  # the top-level marker: on the last block of the prompt
        return Breakpoint("end")
    for i in range(len(body.messages) - 1, -1, -1):
        content = body.messages[i].content
        if isinstance(content, list):
            for j in range(len(content) - 1, -1, -1):
                if _marked(content[j]):
                    return Breakpoint("messages", message=i, block=j)
    if isinstance(body.system, list):
        for j in range(len(body.system) - 1, -1, -1):
            if body.system[j].cache_control is not None:
                return Breakpoint("system", index=j)
    for j in range(len(body.tools or []) - 1, -1, -1):
        if body.tools and body.tools[j].cache_control is not None:
            return Breakpoint("tools", index=j)
    return None


def _messages_before(body: PromptFields, bp: Breakpoint) -> list[MessageParam]:
    """The messages up to and including the breakpoint's block (none for tools or system)."""
    if bp.section != "messages":
        return []
    last = body.messages[bp.message]
    assert isinstance(last.content, list)  # a breakpoint is on a block
    return [*body.messages[:bp.message], last.model_copy(update={"content": last.content[:bp.block + 1]})]


def _ends_the_prompt(body: PromptFields, bp: Breakpoint) -> bool:
    if bp.section == "end":
        return True
    content = body.messages[-1].content
    return (bp.section == "messages" and bp.message == len(body.messages) - 1 and isinstance(content, list)
            and bp.block == len(content) - 1)


def prefix_length(body: PromptFields, bp: Breakpoint, prompt: list[int], model: LoadedModel,
                  settings: ServerSettings) -> int:
    """Tokens of `prompt` that the breakpoint's prefix covers: the prefix rendered alone (a
    finished conversation) shares that many tokens with the whole prompt. A breakpoint on the
    last block covers the prompt; a prefix the template cannot render alone (no user message,
    say) covers nothing."""
    if _ends_the_prompt(body, bp):
        return len(prompt)
    try:
        chat = prefix_request(body, _messages_before(body, bp))
        if chat is None:
            return 0
        conv = plan_conversation(templates(model), chat, chat_options(settings))
    except APIError:
        return 0
    return common_prefix_len(tokenize_prompt(model, conv.prompt), prompt)


def keep_hint(prefix: list[int], namespace: bytes | None = None) -> CacheHint:
    """The pin that keeps `prefix` (the tokens up to the last breakpoint), named by its tokens and,
    for a request with a cache namespace (`cache_salt`), by the namespace: another namespace's
    request with the same prefix neither renews its pin nor learns of it (`POST /cache/hint`)."""
    h = hashlib.sha256(b"".join(t.to_bytes(4, "little") for t in prefix))
    if namespace is not None:
        h.update(b"|namespace|" + namespace)
    return CacheHint(session=SESSION_PREFIX + h.hexdigest()[:32], pin=True)


@dataclass(frozen=True)
class PromptCache:
    """What the breakpoints asked for: the prefix worth keeping, in tokens (0: no breakpoint)."""

    prefix_tokens: int = 0

    def usage(self, prompt_tokens: int, cached_tokens: int) -> dict[str, int]:
        """Anthropic's input-token fields: what was computed outside the prefix, what the
        prefix cost to compute, what was reused; they add up to the prompt."""
        creation = max(0, min(self.prefix_tokens, prompt_tokens) - cached_tokens)
        return {"input_tokens": prompt_tokens - cached_tokens - creation,
                "cache_creation_input_tokens": creation, "cache_read_input_tokens": cached_tokens}
