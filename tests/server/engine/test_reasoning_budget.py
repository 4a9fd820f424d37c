"""The reasoning budget and the lazy tool-call grammar in the sampler chain, on a real vocabulary
(Qwen 3.5's, from the pinned llama.cpp's vocabulary-only GGUF): a lazy grammar's trigger written
inside the reasoning does not fire (llama-server's rule), one written after it does, and a spent
budget forces the message and the end tag.

This vocabulary file has no <think> token: the tag is three tokens, and the budget matches it as
that sequence (a real Qwen3 GGUF has it as one token), so the prefill is the tag's own tokens."""

from __future__ import annotations

import ctypes

import llama_cpp
import numpy as np
import pytest

from harness.models.family_model import vocab_file
from server.engine.reasoning_budget import BudgetState, budget_state
from server.engine.sampling import SamplerChain
from server.engine.sampling_params import Constraint, ReasoningBudget, SamplingParams

TOOL_GRAMMAR = 'root ::= "<tool_call>" [a-z]+ "</tool_call>"'


@pytest.fixture(scope="module")
def vocab():
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(vocab_file("qwen35")).encode(), params)
    assert model
    yield llama_cpp.llama_model_get_vocab(model)
    llama_cpp.llama_model_free(model)


def tokens(vocab, text: str) -> list[int]:
    data = text.encode()
    buf = (llama_cpp.llama_token * (len(data) + 8))()
    n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, len(buf), False, True)
    return list(buf[:n])


def _passing(sampler, vocab) -> np.ndarray:
    """The token ids `sampler` (in its current state) leaves possible."""
    n = llama_cpp.llama_vocab_n_tokens(vocab)
    data = np.zeros(n, dtype=[("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
    data["id"] = np.arange(n)
    arr = llama_cpp.llama_token_data_array(data=data.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data)),
                                           size=n, selected=-1, sorted=False)
    llama_cpp.llama_sampler_apply(sampler, ctypes.byref(arr))
    return data["id"][np.isfinite(data["logit"])]


def allowed(chain: SamplerChain, vocab, token: int) -> bool:
    """Whether the chain's grammar, where it applies now, lets `token` through."""
    return not chain._grammar_applies() or token in _passing(chain._grammar, vocab)


def chain_for(vocab, budget: int = -1, message: str = "") -> SamplerChain:
    constraint = Constraint(TOOL_GRAMMAR, lazy=True, trigger_patterns=("<tool_call>",))
    opened = tuple(tokens(vocab, "<think>") + tokens(vocab, "\n"))
    reasoning = ReasoningBudget("<think>", ("</think>",), budget, message, opened)
    return SamplerChain(SamplingParams(temperature=0, constraint=constraint, reasoning=reasoning), vocab,
                        llama_cpp.llama_vocab_n_tokens(vocab))


def test_a_trigger_inside_the_reasoning_does_not_fire_one_after_it_does(vocab):
    chain = chain_for(vocab)
    try:
        assert budget_state(chain._budget) is BudgetState.COUNTING  # the generation prompt opened it
        for t in tokens(vocab, "I could write <tool_call> here."):
            chain.accept(t)
        word = tokens(vocab, " Hello")[0]
        assert budget_state(chain._budget) is BudgetState.COUNTING and allowed(chain, vocab, word)
        for t in tokens(vocab, "</think>") + tokens(vocab, "\n\n"):
            chain.accept(t)
        assert budget_state(chain._budget) is BudgetState.DONE
        assert allowed(chain, vocab, word)  # the grammar never fired: free text after the reasoning
        for t in tokens(vocab, "Sure. <tool_call>"):
            chain.accept(t)
        assert not allowed(chain, vocab, word)  # now it did: only the call may follow
    finally:
        chain.close()


def test_a_spent_budget_forces_the_message_and_the_end_tag(vocab):
    chain = chain_for(vocab, budget=3, message=" Enough.")
    try:
        thought = tokens(vocab, " one two three four")
        while budget_state(chain._budget) is BudgetState.COUNTING:  # the "\n" after the tag counts too
            chain.accept(thought.pop(0))
        assert budget_state(chain._budget) is BudgetState.FORCING and len(thought) == 2
        forced = tokens(vocab, " Enough.") + tokens(vocab, "</think>")
        for expected in forced:  # only the message, then the end tag, token by token
            assert list(_passing(chain._budget, vocab)) == [expected]
            chain.accept(expected)
        assert budget_state(chain._budget) is BudgetState.DONE
    finally:
        chain.close()
