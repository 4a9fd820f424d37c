"""From a validated request body to an engine `GenerationRequest`: render (llama.cpp's chat
layer, server.api.engine_bridge.conversation), tokenize, check lengths against the model's context,
choose the constraint, collect sampling settings. What the request tells the cache was read from
its HTTP request before (server.api.http.cache_fields): nothing here reads HTTP."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import cast

from server.api.engine_bridge.chat_layer import ChatTemplates, ReplyParser
from server.api.engine_bridge.chat_request import ChatCompletionRequest
from server.api.engine_bridge.completion_request import CompletionRequest
from server.api.engine_bridge.conversation import ChatOptions, Conversation, plan_conversation
from server.api.engine_bridge.grammars import (
    forced_call_grammar,
    json_object_grammar,
    json_schema_grammar,
    requested_grammar,
    tool_grammar,
)
from server.api.engine_bridge.reply_stream import ReplyStream
from server.api.engine_bridge.sampling_fields import SamplingFields
from server.api.http.cache_fields import NO_CACHE_SCOPE, CacheScope
from server.api.http.errors import APIError, invalid
from server.bootstrap import LoadedModel
from server.engine.sampling_params import Constraint, ReasoningBudget, SamplingParams
from server.engine.sequence import GenerationRequest
from server.settings import ServerSettings


@dataclass(frozen=True)
class PreparedRequest:
    generation: GenerationRequest
    conversation: Conversation | None  # a chat request's plan: how its reply is parsed; None: plain text
    prompt_text: str | None

    def reply_stream(self) -> ReplyStream:
        """A reader for one choice's reply (the family's parser for a chat, plain text otherwise)."""
        conv = self.conversation
        if conv is None:
            return ReplyStream(None)
        return ReplyStream(ReplyParser(conv.plan, reasoning_format=conv.reasoning_format,
                                       parse_tool_calls=conv.parse_tool_calls))


def check_model_name(requested: str | None, model: LoadedModel, settings: ServerSettings) -> None:
    """One model is served: any requested name gets it (as with llama-server and SGLang, so
    clients hard-wired to e.g. "gpt-4o-mini" work) and responses report the served name.
    --strict-model-name restores the 404 for a name that is not the served one."""
    if settings.strict_model_name and requested and requested != model.model_name:
        raise APIError(
            f"the model '{requested}' does not exist; this server serves '{model.model_name}'",
            status=404, type="invalid_request_error", param="model", code="model_not_found",
        )


@dataclass(frozen=True)
class OutputBudget:
    max_tokens: int  # hard limit of generated tokens
    reserved: int  # generated tokens whose KV cells admission guarantees


# A request without max_tokens is guaranteed at least this many output cells, even when its
# prompt already fills its even share of the pool.
MIN_DEFAULT_RESERVE = 256


def output_budget(body: SamplingFields, n_prompt: int, model: LoadedModel, settings: ServerSettings,
                  param: str) -> OutputBudget:
    """How many tokens the request may generate, and how many of them are reserved.

    One request may use the model's whole context. With max_tokens, all of it is reserved
    (the request never runs out of cells). Without, the request may generate until the
    context is full, but only its even share of the pool is reserved, so that clients that
    leave max_tokens out still run side by side; past that it runs on free cells and is the
    one stopped ("length") if the pool fills up.
    """
    limit = model.max_request_tokens
    if n_prompt >= limit:
        raise invalid(
            f"the prompt has {n_prompt} tokens; this model's context holds at most {limit} tokens "
            f"(prompt + completion)", param=param, code="context_length_exceeded",
        )
    room = limit - n_prompt
    if body.max_tokens is None:
        return OutputBudget(room, min(room, max(settings.slot_share - n_prompt, MIN_DEFAULT_RESERVE)))
    if body.max_tokens > room:
        raise invalid(
            f"max_tokens={body.max_tokens} does not fit: the prompt has {n_prompt} tokens and this model's "
            f"context holds {limit} (at most {room} more tokens)", param="max_tokens", code="context_length_exceeded",
        )
    return OutputBudget(body.max_tokens, body.max_tokens)


def _sampling(body: SamplingFields, constraint: Constraint, n_vocab: int) -> SamplingParams:
    bias: dict[int, float] = {}
    for key, value in (body.logit_bias or {}).items():
        tok = int(key)
        if not 0 <= tok < n_vocab:
            raise invalid(f"logit_bias token {tok} is outside the vocabulary (0..{n_vocab - 1})", param="logit_bias")
        bias[tok] = value
    return SamplingParams(
        temperature=body.temperature, top_k=body.top_k, top_p=body.top_p, min_p=body.min_p, seed=body.seed,
        repeat_penalty=body.repeat_penalty, repeat_last_n=body.repeat_last_n,
        presence_penalty=body.presence_penalty, frequency_penalty=body.frequency_penalty,
        logit_bias=bias, constraint=constraint,
    )


def speculative_limits(body: SamplingFields, settings: ServerSettings) -> tuple[int | None, int | None]:
    """The request's speculative.n_max / n_min for the engine. speculative.p_min is llama.cpp's draft-simple
    threshold, which one drafter applies to every request: a request may only restate the server's."""
    p_min = body.speculative_p_min
    if p_min is not None and p_min != (settings.spec_draft_p_min if settings.spec_draft_p_min is not None else 0.0):
        raise invalid("speculative.p_min: llama.cpp's draft model takes one threshold for every request; this server "
                      "drafts with --spec-draft-p-min " + str(settings.spec_draft_p_min or 0.0),
                      param="speculative.p_min")
    return body.speculative_n_max, body.speculative_n_min


def tokenize_prompt(model: LoadedModel, text: str) -> list[int]:
    """A prompt's tokens: special tokens parsed, BOS added unless the text already starts with it."""
    info = model.runtime.info
    add_bos = info.add_bos and not (info.bos_token and text.startswith(info.bos_token))
    return model.runtime.tokenize(text, add_special=add_bos, parse_special=True)


def check_choices(body: SamplingFields, settings: ServerSettings) -> None:
    if body.n > settings.max_choices:
        raise invalid(f"n={body.n} choices asked; this server samples at most {settings.max_choices} per request "
                      "(--max-choices)", param="n", code="too_many_choices")


def _reasoning_budget(body: ChatCompletionRequest, plan, constraint: Constraint,
                      settings: ServerSettings) -> ReasoningBudget | None:
    """llama-server's reasoning budget: for a template with thinking tags, when the request (or
    --reasoning-budget) limits the reasoning, or a lazy tool-call grammar must wait until the
    reasoning is over."""
    if not plan.thinking_start_tag or not plan.thinking_end_tags:
        return None
    tokens = body.reasoning_budget_tokens
    if tokens is None:
        tokens = body.thinking_budget_tokens
    if tokens is None:
        tokens = settings.reasoning_budget
    if tokens < 0 and not constraint.lazy:
        return None
    message = body.reasoning_budget_message
    return ReasoningBudget(plan.thinking_start_tag, plan.thinking_end_tags, tokens,
                           settings.reasoning_budget_message if message is None else message,
                           plan.generation_prompt_tokens)


def chat_options(settings: ServerSettings) -> ChatOptions:
    return ChatOptions(reasoning_format=settings.reasoning_format,
                       chat_template_kwargs=settings.chat_template_kwargs)


def templates(model: LoadedModel) -> ChatTemplates:
    """The model's chat templates (LoadedModel holds them untyped: server/bootstrap.py does not import
    the API layer); set as the model loads, before any route serves."""
    return cast(ChatTemplates, model.template)


def prepare_chat(body: ChatCompletionRequest, model: LoadedModel, settings: ServerSettings,
                 cache: CacheScope = NO_CACHE_SCOPE) -> PreparedRequest:
    """The engine request of a chat: checked (model name, choices), rendered by the model's template,
    tokenized, constrained (tools, response_format, grammar), its output budgeted; `cache` is what
    the request's body and headers told the prefix cache (read before: http.cache_fields)."""
    check_model_name(body.model, model, settings)
    check_choices(body, settings)
    conv = plan_conversation(templates(model), body, chat_options(settings))
    plan = conv.plan
    tokens = tokenize_prompt(model, conv.prompt)
    # The reply's constraint: a forced tool call is the family's grammar (its generation prompt
    # fed first); with tools on "auto" the family's lazy grammar waits for its trigger; a
    # response_format or a client's own grammar replaces the lazy one (the family's parser
    # still reads the reply, so a grammar can force a family's exact output in tests).
    constraint = Constraint()
    if conv.forced_tools or (conv.parse_tool_calls and plan.grammar):
        grammar = (forced_call_grammar(plan.grammar, parallel=body.parallel_tool_calls is True)
                   if conv.forced_tools else plan.grammar)
        constraint = Constraint(tool_grammar(grammar, model.runtime.vocab) if grammar else None,
                                lazy=plan.grammar_lazy and not conv.forced_tools,
                                trigger_patterns=plan.trigger_patterns, trigger_tokens=plan.trigger_tokens,
                                prefill=plan.grammar_prefill_tokens)
    own = None
    if body.response_format and body.response_format.type == "json_object":
        own = json_object_grammar()
    elif body.response_format and body.response_format.type == "json_schema":
        assert body.response_format.json_schema is not None  # the schema requires it for this type
        own = json_schema_grammar(body.response_format.json_schema.schema_, param="response_format.json_schema",
                                  vocab=model.runtime.vocab)
    requested = requested_grammar(body.grammar, body.json_schema, model.runtime.vocab)
    if own is not None and conv.forced_tools:
        raise invalid("response_format cannot be combined with a forced tool_choice", param="response_format")
    if requested is not None:
        if own is not None or conv.forced_tools:
            raise invalid("grammar / json_schema cannot be combined with response_format or a forced tool_choice",
                          param="grammar" if body.grammar else "json_schema")
        own = requested
    if own is not None:
        constraint = Constraint(own)
    reasoning = _reasoning_budget(body, plan, constraint, settings)
    budget = output_budget(body, len(tokens), model, settings, param="messages")
    spec_n_max, spec_n_min = speculative_limits(body, settings)
    generation = GenerationRequest(
        prompt_tokens=tokens,
        sampling=replace(_sampling(body, constraint, model.runtime.info.n_vocab), reasoning=reasoning),
        max_tokens=budget.max_tokens,
        reserved_output=budget.reserved,
        stop=list(body.stop or []) + [s for s in plan.additional_stops if s not in (body.stop or [])],
        ignore_eos=body.ignore_eos,
        cache_hint=cache.hint,
        logprobs=body.logprobs_k,
        preserved_tokens=plan.preserved_tokens,
        cache_namespace=cache.namespace,
        speculative_n_max=spec_n_max,
        speculative_n_min=spec_n_min,
    )
    return PreparedRequest(generation, conv, conv.prompt)


def prepare_completion(body: CompletionRequest, model: LoadedModel, settings: ServerSettings,
                       cache: CacheScope = NO_CACHE_SCOPE) -> PreparedRequest:
    """The engine request of a text completion (a prompt as text, tokenized, or as token ids)."""
    check_model_name(body.model, model, settings)
    check_choices(body, settings)
    if isinstance(body.prompt, str):
        text = body.prompt
        tokens = tokenize_prompt(model, text)
    else:
        ids = cast(list[int], body.prompt)  # the schema made a one-string list a str
        n_vocab = model.runtime.info.n_vocab
        if any(not 0 <= t < n_vocab for t in ids):
            raise invalid(f"prompt token ids must be in 0..{n_vocab - 1}", param="prompt")
        text, tokens = None, list(ids)
    budget = output_budget(body, len(tokens), model, settings, param="prompt")
    spec_n_max, spec_n_min = speculative_limits(body, settings)
    generation = GenerationRequest(
        prompt_tokens=tokens,
        sampling=_sampling(body, Constraint(requested_grammar(body.grammar, body.json_schema, model.runtime.vocab)),
                           model.runtime.info.n_vocab),
        max_tokens=budget.max_tokens,
        reserved_output=budget.reserved,
        stop=list(body.stop or []),
        ignore_eos=body.ignore_eos,
        cache_hint=cache.hint,
        logprobs=body.logprobs_k,
        cache_namespace=cache.namespace,
        speculative_n_max=spec_n_max,
        speculative_n_min=spec_n_min,
    )
    return PreparedRequest(generation, None, text)
