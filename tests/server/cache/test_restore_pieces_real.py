"""Restores in pieces on the real engine (issue 58, item 4): a request whose prefix comes back from host
RAM while another request decodes is restored a piece at a time between decode steps (the decoding
one is never stalled for the whole copy), waits for its own restore only, and answers as when its
prompt was computed."""

from __future__ import annotations

import threading
import time

import pytest

from tests.server.cache.engine_harness import chat_tokens, divergence, generate, kept_cells, reset_kv, used_cells
from tests.server.cache.test_router_real import SYSTEM, load

pytestmark = pytest.mark.model


def test_a_host_restore_beside_a_decoding_request_goes_in_pieces():
    model = load(None, parallel=2, cache_restore_step=256, spec_type="none")  # 256 KiB: about 11 tokens a piece
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
    finally:
        model.close()
    assert box["other"].final.completion_tokens == 200
    assert got.final.cache.source == "H" and got.final.cached_tokens >= len(prompt) - 8, got.final
    pieces = stats["restores_in_pieces"]
    assert pieces["restores"] == 1 and pieces["pieces"] > 10, pieces
    assert divergence(got, want, model.runtime.is_eog) is None
    assert leak == 0
