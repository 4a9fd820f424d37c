"""Sampling parameters and their llama.cpp sampler chain.

The order is llama.cpp's own (common_sampler): the reasoning budget (a thinking model's, when
the template has thinking tags), the grammar (constrains the raw logits; a lazy one only outside
the reasoning), then the chain: logit bias, penalties, top-k, top-p, min-p, temperature, a seeded
distribution draw. A temperature of 0 (or below) is greedy. Without a grammar or a budget,
`llama_sampler_sample` applies the chain and accepts the chosen token.

A grammar can reach a dead end: a state no token of the vocabulary can continue (a code
point no UTF-8 token decodes to, like `"\\U00200000"`), where not even end-of-generation is
allowed. Every candidate is then at -inf, the chain still "selects" one, and accepting it
aborts the whole process inside llama.cpp ("Unexpected empty grammar stack", or
GGML_ABORT for an end-of-generation token). A chain with a grammar therefore applies and
accepts in two steps, and refuses to accept a token the grammar ruled out: `sample`
returns None, and the engine stops that request cleanly.
"""

from __future__ import annotations

import ctypes
import math
import random

import llama_cpp
import numpy as np

from server.engine.reasoning_budget import BudgetState, budget_state, end_match, new_budget_sampler
from server.engine.sampling_params import SamplingParams


class GrammarError(ValueError):
    """llama.cpp could not parse a generated grammar."""


# llama_token_data {int32 id; float logit; float p}: candidates are filled with numpy, not per token in Python
_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
assert _TOKEN_DATA.itemsize == ctypes.sizeof(llama_cpp.llama_token_data)


class SamplerChain:
    """Owns a native sampler chain; free it with close() (the engine does, when the request ends)."""

    def __init__(self, params: SamplingParams, vocab, n_vocab: int):
        chain_params = llama_cpp.llama_sampler_chain_default_params()
        chain_params.no_perf = True
        self._chain = llama_cpp.llama_sampler_chain_init(chain_params)
        self._keep_alive: list[object] = []
        # The grammar and the reasoning budget stand outside the chain, as in common_sampler: the
        # budget is applied first, and a lazy grammar only outside the reasoning.
        self._grammar = None
        self._lazy = params.constraint.lazy
        self._budget = None
        # Plain greedy (no grammar, bias or penalties) is a stateless argmax over the raw
        # logits: the runner takes it for all such sequences of a step in one numpy call
        # instead of building n_vocab candidates per sequence (the same token: both keep the
        # first maximum).
        self.plain_greedy = params.greedy and not params.grammar and not params.logit_bias and not (
            params.repeat_penalty != 1.0 or params.presence_penalty != 0.0 or params.frequency_penalty != 0.0) \
            and params.reasoning is None
        self._n_vocab = n_vocab
        checked = bool(params.grammar) or params.reasoning is not None
        self._candidates: np.ndarray | None = np.zeros(n_vocab, dtype=_TOKEN_DATA) if checked else None
        self._ids = np.arange(n_vocab, dtype=np.int32) if checked else None
        try:
            self._build(params, vocab, n_vocab)
        except Exception:
            self.close()
            raise

    def _add(self, sampler) -> None:
        llama_cpp.llama_sampler_chain_add(self._chain, sampler)

    def _build(self, p: SamplingParams, vocab, n_vocab: int) -> None:
        if p.reasoning is not None:
            self._budget = new_budget_sampler(vocab, p.reasoning)
        if p.grammar:
            self._grammar = self._new_grammar(p.constraint, vocab)
            if not self._grammar:
                raise GrammarError("llama.cpp rejected the generated grammar")
            for token in p.constraint.prefill:  # the grammar only: penalties never saw the prompt either
                llama_cpp.llama_sampler_accept(self._grammar, token)
        if p.logit_bias:
            arr = (llama_cpp.llama_logit_bias * len(p.logit_bias))()
            for i, (tok, bias) in enumerate(p.logit_bias.items()):
                arr[i].token = tok
                arr[i].bias = bias
            self._keep_alive.append(arr)
            self._add(llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(p.logit_bias), arr))
        if p.repeat_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0:
            self._add(
                llama_cpp.llama_sampler_init_penalties(
                    n_vocab,
                    p.repeat_last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty
                )
            )
        if p.greedy:
            self._add(llama_cpp.llama_sampler_init_greedy())
            return
        if p.top_k > 0:
            self._add(llama_cpp.llama_sampler_init_top_k(p.top_k))
        if p.top_p < 1.0:
            self._add(llama_cpp.llama_sampler_init_top_p(p.top_p, 1))
        if p.min_p > 0.0:
            self._add(llama_cpp.llama_sampler_init_min_p(p.min_p, 1))
        self._add(llama_cpp.llama_sampler_init_temp(p.temperature))
        seed = p.seed if p.seed is not None else random.getrandbits(32)
        self._add(llama_cpp.llama_sampler_init_dist(seed & 0xFFFFFFFF))

    def _new_grammar(self, c, vocab):
        if not c.lazy:
            return llama_cpp.llama_sampler_init_grammar(vocab, c.grammar.encode(), b"root")
        patterns = [t.encode() for t in c.trigger_patterns]
        pattern_arr = (ctypes.c_char_p * max(1, len(patterns)))(*patterns)
        token_arr = (llama_cpp.llama_token * max(1, len(c.trigger_tokens)))(*c.trigger_tokens)
        self._keep_alive.extend([patterns, pattern_arr, token_arr])
        return llama_cpp.llama_sampler_init_grammar_lazy_patterns(
            vocab, c.grammar.encode(), b"root", pattern_arr, len(patterns), token_arr, len(c.trigger_tokens))

    def sample(self, ctx, batch_index: int) -> int | None:
        """Sample (and accept) the next token from output row `batch_index` of the last decode;
        None when the grammar allows no token at all (a dead end: nothing was accepted)."""
        if self._candidates is None:
            return int(llama_cpp.llama_sampler_sample(self._chain, ctx, batch_index))
        return self._sample_checked(ctx, batch_index)

    def _sample_checked(self, ctx, batch_index: int) -> int | None:
        """`llama_sampler_sample` in two steps (what it does on the CPU: candidates from the
        logits, apply the chain, accept the selection), with a look at the selection between."""
        cands = self._candidates
        assert cands is not None  # allocated for checked sampling, the only caller
        row = llama_cpp.llama_get_logits_ith(ctx, batch_index)
        if not row:  # llama_sampler_sample would abort here (GGML_ASSERT); fail the step instead
            raise RuntimeError(f"no logits for output row {batch_index}")
        logits = np.ctypeslib.as_array(row, shape=(self._n_vocab,))
        cands["id"] = self._ids  # samplers sort and cut the array in place: refill it every time
        cands["logit"] = logits
        cands["p"] = 0.0
        arr = llama_cpp.llama_token_data_array(
            data=cands.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data)), size=self._n_vocab,
            selected=-1, sorted=False)
        if self._budget is not None:
            llama_cpp.llama_sampler_apply(self._budget, ctypes.byref(arr))
        if self._grammar_applies():
            llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(arr))
        llama_cpp.llama_sampler_apply(self._chain, ctypes.byref(arr))
        if not 0 <= arr.selected < arr.size:
            return None
        chosen = arr.data[arr.selected]
        # The grammar sets what it rules out to -inf, and nothing later in the chain makes a
        # -inf logit finite again: a -inf selection means every token was ruled out.
        if math.isinf(chosen.logit) and chosen.logit < 0:
            return None
        token = int(chosen.id)
        self.accept(token)
        return token

    def _grammar_applies(self) -> bool:
        """common_sampler's rule: a lazy grammar only outside the reasoning (before or after it)."""
        if self._grammar is None:
            return False
        if self._budget is None or not self._lazy:
            return True
        return budget_state(self._budget) in (BudgetState.IDLE, BudgetState.DONE)

    def accept(self, token: int) -> None:
        """Advance every sampler's state past `token` (sampled here, or forced by the engine)."""
        grammar_accepts = self._grammar_applies()
        if self._budget is not None:
            llama_cpp.llama_sampler_accept(self._budget, token)
            if self._grammar is not None and not grammar_accepts \
                    and budget_state(self._budget) is BudgetState.DONE:
                # the reasoning just ended: its end tag may be part of the grammar's trigger
                for end_token in end_match(self._budget):
                    llama_cpp.llama_sampler_accept(self._grammar, end_token)
        if self._grammar is not None and grammar_accepts:
            llama_cpp.llama_sampler_accept(self._grammar, token)
        llama_cpp.llama_sampler_accept(self._chain, token)

    def close(self) -> None:
        for name in ("_chain", "_grammar", "_budget"):
            sampler = getattr(self, name, None)
            if sampler:
                llama_cpp.llama_sampler_free(sampler)
            setattr(self, name, None)
        self._keep_alive.clear()
        self._candidates = self._ids = None

