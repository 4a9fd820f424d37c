"""A look at what a sequence's KV gives without keeping it (real-engine tests of moved cells)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from server.engine.llama_runtime import LlamaRuntime


def next_logits(rt: LlamaRuntime, seq: int, pos: int, token: int) -> np.ndarray:
    """The logits of `token` decoded at `pos` in `seq`, its cell removed afterwards, so the KV is as before."""
    # imported here, as in the tests: llama.cpp loads when a test runs, not when tests are collected
    from server.engine.llama_runtime import BatchEntry

    rt.decode([BatchEntry(token, pos, seq, True)])
    row = np.array(rt.logits_matrix(1))
    assert rt.seq_rm(seq, pos, -1)
    return row
