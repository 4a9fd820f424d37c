"""The one decode failure the engine recovers from: no free cells in the unified KV."""

from __future__ import annotations


class KVCacheFull(RuntimeError):
    """llama_decode found no free KV cells for the batch (its return code 1).

    llama.cpp checks every micro-batch for room before it computes anything, so when this
    is raised nothing of the batch ran and the same batch may be decoded again once cells
    have been freed.
    """

    def __init__(self, n_tokens: int):
        super().__init__(f"no free KV cells for a batch of {n_tokens} tokens")
        self.n_tokens = n_tokens
