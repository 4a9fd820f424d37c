"""Restores beside a decoding request on the real engine (issue 58, item 4): a request whose prefix comes back from host
RAM while another request decodes waits for its own restore only, and answers as when its prompt was computed.

- With paged attention (the CPU's default) the restore is staged: its cells are taken on the engine thread and its K
  and V written on the runtime's write thread while the other request's decodes run (native/src/llama-state-staged.h).
- Without it (--paged-attn off: llama.cpp's kernels may read a masked cell) it goes a piece at a time between decode
  steps, so the decoding request is never stalled for the whole copy.
"""

from __future__ import annotations

import threading
import time

import pytest

from tests.server.cache.engine_harness import chat_tokens, divergence, generate, kept_cells, reset_kv, used_cells
from tests.server.cache.test_router_real import SYSTEM, load

pytestmark = pytest.mark.model


def restore_beside_a_decode(**overrides):
    """A prompt answered, its KV sent to host RAM, then asked again while a long generation decodes: (the first answer,
    the second, the other request's, the cache's stats, the cells leaked)."""
    model = load(None, parallel=2, cache_restore_step=256, spec_type="none", **overrides)  # 256 KiB: ~11 tokens a piece
    try:
        prompt = chat_tokens(model, SYSTEM * 3, "Which device failed last night, and what should the shift do?")
        want = generate(model, prompt, max_tokens=6)  # computed
        reset_kv(model)  # its KV goes to host RAM
        other = chat_tokens(model, "You are a poet.", "Write a long poem about pumps.")
        box = {}
        decoding = threading.Thread(target=lambda: box.setdefault("other", generate(model, other, max_tokens=200,
                                                                                    ignore_eos=True)))
        decoding.start()
        deadline = time.monotonic() + 60
        while not model.engine.scheduler.running and time.monotonic() < deadline:
            time.sleep(0.01)  # until the other request runs
        time.sleep(0.2)
        got = generate(model, prompt, max_tokens=6)
        decoding.join(300)
        stats = model.router.stats()
        reset_kv(model)
        leak = used_cells(model) - kept_cells(model)
        is_eog = model.runtime.is_eog
    finally:
        model.close()
    assert box["other"].final.completion_tokens == 200
    assert got.final.cache.source == "H" and got.final.cached_tokens >= len(prompt) - 8, got.final
    assert divergence(got, want, is_eog) is None
    assert leak == 0
    return stats


def test_a_host_restore_beside_a_decoding_request_is_written_beside_it():
    stats = restore_beside_a_decode()
    staged, pieces = stats["restores_staged"], stats["restores_in_pieces"]
    assert staged["enabled"] and staged["restores"] == 1, staged
    assert pieces["restores"] == 0 and pieces["pieces"] == 0, pieces
    assert staged["max_stage_ms"] > 0, staged  # the engine thread's part (the cells taken) is measured


def test_without_paged_attention_a_host_restore_beside_a_decoding_request_goes_in_pieces():
    stats = restore_beside_a_decode(paged_attn="off")
    staged, pieces = stats["restores_staged"], stats["restores_in_pieces"]
    assert not staged["enabled"] and staged["restores"] == 0, staged
    assert pieces["restores"] == 1 and pieces["pieces"] > 10, pieces
