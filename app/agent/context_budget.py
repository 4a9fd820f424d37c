"""The context budget of one model call: the request fits the server's context, or fails clearly.

Per call: read the limit (once per workbench, see `context_limit`), count the prompt (exactly,
by the server's template and tokenizer, where it offers them: `token_count`; else by the
branch's own estimate: `token_estimate`), compact the history when the prompt would not leave
room for a full answer (`compaction`, from the branch's level, forward only), and clamp
``max_tokens`` to what remains. With no limit known (the server reports none and
``LLM_CONTEXT_TOKENS`` is unset) the request goes out as it is.

The room kept for the answer is ``LLM_MAX_TOKENS``, but never more than half the context:
a large ``max_tokens`` setting must not squeeze the history out; the answer then gets what
remains after the prompt instead.

What a branch learns (its level, its estimate) comes in and goes out as a `ContextState`,
which the graph keeps in the branch's thread (app/agent/context_state.py); this object holds
only what belongs to the server (its limit, whether it counts tokens).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from app.agent.compaction import Compaction, compact
from app.agent.context_limit import ContextLimit, ContextLimitReader
from app.agent.context_state import ContextState
from app.agent.model_client import ModelBackendError
from app.agent.token_count import ServerTokenCounter
from app.agent.token_estimate import TokenEstimator, prompt_tools
from app.settings import WorkbenchSettings

MIN_ANSWER_TOKENS = 16  # below this the call is not worth making


@dataclass(frozen=True)
class FittedRequest:
    """What one model call sends: the conversation (no system prompt) and max_tokens, and the
    branch's context state after it (its level, moved forward if this call stepped)."""

    conversation: list[dict]
    max_tokens: int
    limit: ContextLimit | None = None
    compaction: Compaction | None = None  # None when no limit is known
    context: ContextState = ContextState()
    exact: bool = False  # the token counts are the server's, not estimates
    prompt_tokens: int | None = None  # the prompt sent (None when no limit is known)

    @property
    def room(self) -> int | None:
        """Tokens the context has left after the prompt (None when no limit is known)."""
        if self.limit is None or self.prompt_tokens is None:
            return None
        return self.limit.n_ctx - self.prompt_tokens

    @property
    def compacted(self) -> bool:
        return self.compaction is not None and self.compaction.compacted


class ContextBudget:
    """One per workbench (the limit and the token counting are the server's)."""

    def __init__(self, settings: WorkbenchSettings) -> None:
        self.max_tokens = settings.llm_max_tokens
        timeout_s = min(settings.llm_timeout_s, 10.0)
        self.reader = ContextLimitReader(settings.llm_base_url, settings.llm_api_key, settings.llm_context_tokens,
                                         timeout_s=timeout_s)
        self.counter = ServerTokenCounter(settings.llm_base_url, settings.llm_api_key, timeout_s=timeout_s)

    async def fit(self, model: str, system: dict, conversation: list[dict], history_len: int,
                  tools: list[dict] | None, tool_choice: object, state: ContextState = ContextState()) -> FittedRequest:
        """Fit `conversation` (its first `history_len` messages are past turns) after `system`,
        for a request offering `tools` with `tool_choice`, on a branch whose context state is
        `state`; ModelBackendError (`context_exceeded`) when even the compacted request leaves
        no room for an answer."""
        fitted = await self.measure(model, system, conversation, history_len, tools, tool_choice, state)
        if fitted.limit is not None and fitted.room is not None and fitted.room < MIN_ANSWER_TOKENS:
            limit = fitted.limit
            raise ModelBackendError(
                f"the request needs about {fitted.prompt_tokens} tokens even with the history compacted, and the "
                f"model's context holds {limit.n_ctx} (from {limit.source}): shorten the message, or lower "
                "ARBOR_TOOL_RESULT_MAX_TOKENS so tool results take less room", "context_exceeded")
        return fitted

    def reserve(self, limit: ContextLimit) -> int:
        """The room kept for a full answer in a context of `limit`."""
        return min(self.max_tokens, limit.n_ctx // 2)

    async def measure(self, model: str, system: dict, conversation: list[dict], history_len: int,
                      tools: list[dict] | None, tool_choice: object,
                      state: ContextState = ContextState()) -> FittedRequest:
        """`fit`, without the refusal: the compacted request and its prompt's tokens, however
        little room they leave (`max_tokens` may then be below MIN_ANSWER_TOKENS, or negative)."""
        limit = await self.reader.get(model)
        if limit is None:
            return FittedRequest(conversation, self.max_tokens, context=state)
        reserve = self.reserve(limit)
        estimator = TokenEstimator(state.chars_per_token)
        exact_counts: list[bool] = []
        counts: dict[str, int] = {}  # the server's counts in this fit, by request

        async with self.counter.session() as server_count:
            async def count(messages: list[dict], this_step: bool = False) -> int:
                """The prompt with `messages`: the server's count where it gives one (always with
                the tools: arbor-server renders them even for tool_choice "none"), else the
                estimate; for compaction (not `this_step`) the larger estimate with and without
                the tools, whatever this step's tool_choice. Either way every step of a turn
                compacts alike (a tool step and the answer step after it keep one prefix)."""
                full = [system, *messages]
                key = json.dumps(full, ensure_ascii=False, sort_keys=True)
                counted = counts.get(key)  # the request finally sent was counted while compacting
                if counted is None and server_count:
                    counted = await server_count(full, tools)
                exact_counts.append(counted is not None)
                if counted is not None:
                    counts[key] = counted
                    return counted
                if this_step:
                    return estimator.tokens(full, prompt_tools(tools, tool_choice))
                return max(estimator.tokens(full, tools or None), estimator.tokens(full, None))

            # Chunks of about n_ctx characters (a quarter to a third of the context in tokens),
            # and a step leaves a quarter of the context free: compaction then steps a few
            # times per context's worth of growth, not on every call once the context is full.
            compaction = await compact(conversation, history_len, count, limit.n_ctx - reserve,
                                       chunk_chars=limit.n_ctx, level=state.level, headroom=limit.n_ctx // 4)
            prompt = await count(compaction.messages, this_step=True)
        room = limit.n_ctx - prompt
        context = ContextState(state.level.forward(compaction.level), state.chars_per_token)
        return FittedRequest(compaction.messages, min(self.max_tokens, room), limit, compaction, context,
                             exact=all(exact_counts), prompt_tokens=prompt)

    @staticmethod
    def observe(body: dict, prompt_tokens: int | None, state: ContextState) -> ContextState:
        """`state` with its estimate calibrated by the server's count of an answered request."""
        estimator = TokenEstimator(state.chars_per_token)
        estimator.observe(body["messages"], prompt_tools(body.get("tools"), body.get("tool_choice")), prompt_tokens)
        return ContextState(state.level, estimator.ratios)

    @staticmethod
    def tighten(body: dict, error_message: str, state: ContextState) -> ContextState:
        """The server refused `body` as too long: `state` with an estimate that counts harder."""
        estimator = TokenEstimator(state.chars_per_token)
        estimator.tighten(body["messages"], prompt_tools(body.get("tools"), body.get("tool_choice")),
                          error_message)
        return ContextState(state.level, estimator.ratios)
