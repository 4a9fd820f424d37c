"""Sampling parameters and their llama.cpp sampler chain.

The chain follows llama.cpp's own order: grammar (constrains the raw logits), logit bias,
penalties, top-k, top-p, min-p, temperature, then a seeded distribution draw. A temperature
of 0 (or below) is greedy. `llama_sampler_sample` applies the chain and accepts the
chosen token, so grammar and penalty state advance by themselves.
"""

from __future__ import annotations

import random

import llama_cpp

from server.engine.sampling_params import SamplingParams


class GrammarError(ValueError):
    """llama.cpp could not parse a generated grammar."""


class SamplerChain:
    """Owns a native sampler chain; free it with close() (the engine does, when the request ends)."""

    def __init__(self, params: SamplingParams, vocab, n_vocab: int):
        chain_params = llama_cpp.llama_sampler_chain_default_params()
        chain_params.no_perf = True
        self._chain = llama_cpp.llama_sampler_chain_init(chain_params)
        self._keep_alive: list[object] = []
        # Plain greedy (no grammar, bias or penalties) is a stateless argmax over the raw
        # logits: the runner takes it for all such sequences of a step in one numpy call
        # instead of building n_vocab candidates per sequence (the same token: both keep the
        # first maximum).
        self.plain_greedy = params.greedy and not params.grammar and not params.logit_bias and not (
            params.repeat_penalty != 1.0 or params.presence_penalty != 0.0 or params.frequency_penalty != 0.0)
        try:
            self._build(params, vocab, n_vocab)
        except Exception:
            self.close()
            raise

    def _add(self, sampler) -> None:
        llama_cpp.llama_sampler_chain_add(self._chain, sampler)

    def _build(self, p: SamplingParams, vocab, n_vocab: int) -> None:
        if p.grammar:
            grammar = llama_cpp.llama_sampler_init_grammar(vocab, p.grammar.encode(), b"root")
            if not grammar:
                raise GrammarError("llama.cpp rejected the generated grammar")
            self._add(grammar)
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

    def sample(self, ctx, batch_index: int) -> int:
        """Sample (and accept) the next token from output row `batch_index` of the last decode."""
        return int(llama_cpp.llama_sampler_sample(self._chain, ctx, batch_index))

    def accept(self, token: int) -> None:
        """Feed a token the chain did not sample itself (e.g. a forced one)."""
        llama_cpp.llama_sampler_accept(self._chain, token)

    def close(self) -> None:
        if self._chain:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None
        self._keep_alive.clear()

