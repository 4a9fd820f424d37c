"""Sentence embeddings from a second llama.cpp context on the already loaded model.

Contract:
- Its own context (embeddings on, one sequence, `n_ctx` = batch = ubatch so a whole input
  runs in one ubatch, as non-causal pooling needs): it shares the model's weights and
  nothing else, so embedding never reads or writes the generation context's KV.
- Pooling comes from the GGUF (`pooling="model"`) or is forced (mean, cls, last). A
  model whose pooling is "none" (generative models such as SmolLM2) yields one vector per
  token, not per input: it is refused with `EmbeddingsUnavailable` unless a pooling is
  forced.
- Vectors are L2-normalised (as OpenAI's and llama-server's /v1/embeddings).
- Not thread-safe: the caller runs `embed` on the engine thread (Engine.run_exclusive),
  as every other llama.cpp call, so the two contexts never compute at once.
"""

from __future__ import annotations

import math

import llama_cpp

POOLING = {"model": llama_cpp.LLAMA_POOLING_TYPE_UNSPECIFIED, "mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN,
           "cls": llama_cpp.LLAMA_POOLING_TYPE_CLS, "last": llama_cpp.LLAMA_POOLING_TYPE_LAST}
_POOLING_NAMES = {v: k for k, v in POOLING.items()} | {llama_cpp.LLAMA_POOLING_TYPE_NONE: "none",
                                                          llama_cpp.LLAMA_POOLING_TYPE_RANK: "rank"}


class EmbeddingsUnavailable(RuntimeError):
    """This model (or configuration) cannot produce one vector per input; the message says why."""


class Embedder:
    def __init__(self, model, *, n_ctx: int, n_threads: int, pooling: str = "model"):
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = n_ctx
        cparams.n_seq_max = 1
        cparams.n_threads = cparams.n_threads_batch = n_threads
        cparams.embeddings = True
        cparams.pooling_type = POOLING[pooling]
        cparams.no_perf = True
        self._ctx = llama_cpp.llama_init_from_model(model, cparams)
        if not self._ctx:
            raise EmbeddingsUnavailable(f"llama.cpp could not create an embeddings context of {n_ctx} tokens")
        self.n_ctx = n_ctx
        self.n_embd = int(llama_cpp.llama_model_n_embd(model))
        self.pooling = _POOLING_NAMES.get(int(llama_cpp.llama_pooling_type(self._ctx)), "unknown")
        if self.pooling not in ("mean", "cls", "last"):
            self.close()
            raise EmbeddingsUnavailable(
                f"the model's pooling is '{self.pooling}' (it yields one vector per token, not per input); "
                f"start the server with --pooling mean|cls|last to embed with it")
        self._batch = llama_cpp.llama_batch_init(n_ctx, 0, 1)

    def embed(self, tokens: list[int]) -> list[float]:
        """The normalised embedding of one input (1 ≤ len(tokens) ≤ n_ctx)."""
        if not 0 < len(tokens) <= self.n_ctx:
            raise ValueError(f"an input must have 1..{self.n_ctx} tokens, got {len(tokens)}")
        b = self._batch
        for i, tok in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, i, 1, 1
            b.seq_id[i][0] = 0
        b.n_tokens = len(tokens)
        memory = llama_cpp.llama_get_memory(self._ctx)
        try:
            rc = llama_cpp.llama_decode(self._ctx, b)
            if rc != 0:
                raise RuntimeError(f"llama_decode failed with code {rc}")
            ptr = llama_cpp.llama_get_embeddings_seq(self._ctx, 0)
            if not ptr:
                raise RuntimeError("llama.cpp returned no pooled embedding")
            vec = [float(ptr[i]) for i in range(self.n_embd)]
        finally:
            if memory:  # encoder-only models keep no KV
                llama_cpp.llama_memory_clear(memory, True)
        norm = math.sqrt(sum(x * x for x in vec)) or 1.0
        return [x / norm for x in vec]

    def close(self) -> None:
        if getattr(self, "_batch", None) is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
