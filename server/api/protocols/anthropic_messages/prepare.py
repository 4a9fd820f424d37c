"""A Messages request made ready for the engine: translated (translate.py), prepared as a chat
request is (server.api.engine_bridge.prompting.prepare_chat: render, tokenize, constrain, sample), then its
`cache_control` breakpoints applied (cache_control.py); and the token count of its prompt."""

from __future__ import annotations

from dataclasses import replace

from fastapi import Request

from server.api.engine_bridge.conversation import plan_conversation
from server.api.engine_bridge.prompting import PreparedRequest, chat_options, check_model_name, prepare_chat, templates
from server.api.engine_bridge.prompting import (
    _tokenize_prompt as tokenize_prompt,  # prepare_chat's own: the same BOS rule
)
from server.api.protocols.anthropic_messages.cache_control import (
    PromptCache,
    has_arbor_hint,
    keep_hint,
    last_breakpoint,
    prefix_length,
)
from server.api.protocols.anthropic_messages.request import CountTokensRequest, MessagesRequest
from server.api.protocols.anthropic_messages.translate import chat_request
from server.bootstrap import LoadedModel
from server.settings import ServerSettings


def prepare_messages(body: MessagesRequest, model: LoadedModel, settings: ServerSettings,
                     http: Request | None = None) -> tuple[PreparedRequest, PromptCache]:
    """The engine request of `body` and what its breakpoints ask the cache for. A request with
    breakpoints and without Arbor's own hint carries the pin of its breakpoint prefix."""
    prepared = prepare_chat(chat_request(body, settings), model, settings, http)
    bp = last_breakpoint(body)
    if bp is None:
        return prepared, PromptCache()
    tokens = prepared.generation.prompt_tokens
    covered = prefix_length(body, bp, tokens, model, settings)
    if covered and not has_arbor_hint(body.cache, http):
        hint = keep_hint(tokens[:covered], prepared.generation.cache_namespace)
        prepared = replace(prepared, generation=replace(prepared.generation, cache_hint=hint))
    return prepared, PromptCache(covered)


def count_tokens(body: CountTokensRequest, model: LoadedModel, settings: ServerSettings) -> int:
    """Tokens of the prompt `body` renders to: the prompt a message request with these fields
    would send to the model (tools, system and the generation prompt included)."""
    check_model_name(body.model, model, settings)
    conv = plan_conversation(templates(model), chat_request(body, settings), chat_options(settings))
    return len(tokenize_prompt(model, conv.prompt))
