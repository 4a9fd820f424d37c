"""llama-server's reasoning-budget sampler (common/reasoning-budget.cpp), from libarbor-chat.

It follows a thinking model's reasoning token by token (idle before it, counting inside, done
after), forces the end tag (after a message) when the budget is spent, and tells the sampler
chain when a lazy tool-call grammar may apply: only outside the reasoning, as common_sampler
does, so a model that thinks "I will write <tool_call>" is not forced into a call mid-thought.
"""

from __future__ import annotations

import ctypes
import json
from enum import IntEnum

import llama_cpp

from server.engine.chat_library import chat_library, error_text
from server.engine.sampling_params import ReasoningBudget


class BudgetState(IntEnum):
    IDLE = 0
    COUNTING = 1
    FORCING = 2
    WAITING_UTF8 = 3
    DONE = 4


class ReasoningBudgetError(ValueError):
    """llama.cpp could not build the reasoning-budget sampler (e.g. a template without tags)."""


def new_budget_sampler(vocab, budget: ReasoningBudget):
    """A native llama_sampler; the caller owns it (llama_sampler_free)."""
    params = {"start_tag": budget.start_tag, "end_tags": list(budget.end_tags), "budget": budget.budget,
              "message": budget.message, "prefill": list(budget.prefill)}
    err = ctypes.c_void_p()
    ptr = chat_library().arbor_chat_reasoning_budget_init(vocab, json.dumps(params).encode(), ctypes.byref(err))
    if not ptr:
        raise ReasoningBudgetError(error_text(err, "llama.cpp could not build the reasoning budget sampler"))
    return ctypes.cast(ptr, llama_cpp.llama_sampler_p_ctypes)


def budget_state(sampler) -> BudgetState:
    return BudgetState(chat_library().arbor_chat_reasoning_budget_state(sampler))


def end_match(sampler) -> list[int]:
    """The end sequence that closed the reasoning, or []."""
    buf = (llama_cpp.llama_token * 64)()
    n = chat_library().arbor_chat_reasoning_budget_end_match(sampler, buf, len(buf))
    return list(buf[:min(n, len(buf))])
