"""A Messages request made ready for the engine, in one direction: translated (translate.py) and
its `cache_control` breakpoints read (cache_control.py), then prepared as a chat request is
(server.api.engine_bridge.prepare_chat: render, tokenize, constrain, sample), then the prefix its
last breakpoint covers rendered and pinned; and the token count of its prompt."""

from __future__ import annotations

from dataclasses import replace

from server.api.engine_bridge.conversation import plan_conversation
from server.api.engine_bridge.prompting import (
    PreparedRequest,
    chat_options,
    check_model_name,
    prepare_chat,
    templates,
    tokenize_prompt,
)
from server.api.http.cache_fields import CacheScope
from server.api.protocols.anthropic_messages.cache_control import (
    PromptCache,
    keep_hint,
    last_breakpoint,
    prefix_length,
)
from server.api.protocols.anthropic_messages.request import CountTokensRequest, MessagesRequest
from server.api.protocols.anthropic_messages.translate import chat_request
from server.bootstrap import LoadedModel
from server.settings import ServerSettings


def prepare_messages(body: MessagesRequest, model: LoadedModel, settings: ServerSettings,
                     cache: CacheScope) -> tuple[PreparedRequest, PromptCache]:
    """The engine request of `body` and what its breakpoints ask the cache for. A request with
    breakpoints and without Arbor's own hint (`cache.client_hint`) carries the pin of its
    breakpoint prefix."""
    chat = chat_request(body, settings)
    bp = last_breakpoint(body)
    prepared = prepare_chat(chat, model, settings, cache)
    if bp is None:
        return prepared, PromptCache()
    tokens = prepared.generation.prompt_tokens
    covered = prefix_length(body, bp, tokens, model, settings)
    if covered and not cache.client_hint:
        hint = keep_hint(tokens[:covered], prepared.generation.cache_namespace)
        prepared = replace(prepared, generation=replace(prepared.generation, cache_hint=hint))
    return prepared, PromptCache(covered)


def count_tokens(body: CountTokensRequest, model: LoadedModel, settings: ServerSettings) -> int:
    """Tokens of the prompt `body` renders to: the prompt a message request with these fields
    would send to the model (tools, system and the generation prompt included)."""
    check_model_name(body.model, model, settings)
    conv = plan_conversation(templates(model), chat_request(body, settings), chat_options(settings))
    return len(tokenize_prompt(model, conv.prompt))
