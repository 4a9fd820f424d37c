"""The context budget of one model call: the request fits the server's context, or fails clearly.

Per call: read the limit (once per workbench, see `context_limit`), estimate the prompt
(`token_estimate`), compact the history when the prompt would not leave room for a full
answer (`compaction`), and clamp ``max_tokens`` to what remains. With no limit known (the
server reports none and ``LLM_CONTEXT_TOKENS`` is unset) the request goes out as it is.

The room kept for the answer is ``LLM_MAX_TOKENS``, but never more than half the context:
a large ``max_tokens`` setting must not squeeze the history out; the answer then gets what
remains after the prompt instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.agent.compaction import Compaction, compact
from app.agent.context_limit import ContextLimit, ContextLimitReader
from app.agent.model_client import ModelBackendError
from app.agent.token_estimate import TokenEstimator, prompt_tools
from app.settings import WorkbenchSettings

MIN_ANSWER_TOKENS = 16  # below this the call is not worth making


@dataclass(frozen=True)
class FittedRequest:
    """What one model call sends: the conversation (no system prompt) and max_tokens."""

    conversation: list[dict]
    max_tokens: int
    limit: ContextLimit | None = None
    compaction: Compaction | None = None  # None when no limit is known

    @property
    def compacted(self) -> bool:
        return self.compaction is not None and self.compaction.compacted


class ContextBudget:
    """One per workbench (the limit is the server's; the estimator learns from every call)."""

    def __init__(self, settings: WorkbenchSettings) -> None:
        self.max_tokens = settings.llm_max_tokens
        self.reader = ContextLimitReader(settings.llm_base_url, settings.llm_api_key, settings.llm_context_tokens,
                                         timeout_s=min(settings.llm_timeout_s, 10.0))
        self.estimator = TokenEstimator()

    async def fit(self, model: str, system: dict, conversation: list[dict], history_len: int,
                  tools: list[dict] | None, tool_choice: object) -> FittedRequest:
        """Fit `conversation` (its first `history_len` messages are past turns) after `system`,
        for a request offering `tools` with `tool_choice`."""
        limit = await self.reader.get(model)
        if limit is None:
            return FittedRequest(conversation, self.max_tokens)
        reserve = min(self.max_tokens, limit.n_ctx // 2)

        def count(messages: list[dict]) -> int:
            # The larger of the estimates with and without the tools in the prompt, whatever
            # this step's tool_choice: every step of a turn then compacts alike (a tool step
            # and the answer step after it keep one prefix), erring on the safe side.
            full = [system, *messages]
            return max(self.estimator.tokens(full, tools or None), self.estimator.tokens(full, None))

        # Chunks of about n_ctx characters (a quarter to a third of the context in tokens):
        # compaction then moves a few times per context's worth of growth.
        compaction = compact(conversation, history_len, count, limit.n_ctx - reserve, chunk_chars=limit.n_ctx)
        prompt = self.estimator.tokens([system, *compaction.messages], prompt_tools(tools, tool_choice))
        room = limit.n_ctx - prompt
        if room < MIN_ANSWER_TOKENS:
            raise ModelBackendError(
                f"the request needs about {prompt} tokens even with the history compacted, and the "
                f"model's context holds {limit.n_ctx} (from {limit.source}): shorten the message, or lower "
                "ARBOR_TOOL_RESULT_MAX_TOKENS so tool results take less room", "context_exceeded")
        return FittedRequest(compaction.messages, min(self.max_tokens, room), limit, compaction)

    def observe(self, body: dict, prompt_tokens: int | None) -> None:
        """Calibrate the estimate with the server's count of an answered request."""
        self.estimator.observe(body["messages"], prompt_tools(body.get("tools"), body.get("tool_choice")),
                               prompt_tokens)

    def tighten(self, body: dict, error_message: str) -> None:
        """The server refused `body` as too long: estimate harder before the retry."""
        self.estimator.tighten(body["messages"], prompt_tools(body.get("tools"), body.get("tool_choice")),
                               error_message)
