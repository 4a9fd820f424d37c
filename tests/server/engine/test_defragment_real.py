"""Paged attention's defragmentation through the real engine (issue 60, item 5): the runner's wiring
(tests/server/engine/test_runner_defragment.py) on the embedded model, not a fake runtime.

A full pool makes llama.cpp put a prompt's cells among other sequences' (owned pages have run out);
the next request finds no free cell, the engine frees an idle slot's KV (kv_full) and defragments:
the count that /metrics reports as `arbor:kv_cells_defragmented_total` (server/api/app.py reads
`runtime.n_cells_defragmented`) goes up, a moved sequence no longer shares a page with the prompt,
every paged mask passes llama.cpp's self-check, and the moved sequence answers as before the move.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.cores import model_threads
from tests.server.cache.engine_harness import assert_same_answer, generate
from tests.server.conftest import embedded_model_available

pytestmark = pytest.mark.model

PAGE = 16
CTX = 256  # 16 pages


def test_a_full_pool_is_defragmented_when_cells_are_freed(monkeypatch):
    why = embedded_model_available()
    if why:
        pytest.skip(why)
    from server import bootstrap
    from server.settings import ServerSettings

    monkeypatch.setenv("LLAMA_PAGED_ATTN_SELF_CHECK", "1")
    model = bootstrap.load(ServerSettings(parallel=5, ctx_size=CTX, batch_size=CTX, page_size=PAGE,
                                          cache_tiers=("A",), threads=model_threads(), spec_type="none"))
    try:
        rt = model.runtime
        assert rt.paged_attn.enabled and rt.page_placement == "owned"
        rng = np.random.default_rng(3)
        short = [rng.integers(200, 40000, PAGE + 1).tolist() for _ in range(3)]
        answers = [generate(model, p, max_tokens=1) for p in short]  # a page and one cell each: 6 pages
        # 10 free pages and 3 x 15 free cells in the short prompts' second pages: this prompt takes them all
        generate(model, rng.integers(200, 40000, 10 * PAGE + 3 * (PAGE - 1)).tolist(), max_tokens=1)

        def pages() -> dict[int, set[int]]:
            return {s.index: set(rt.seq_pages(s.seq_id)) for s in model.slots.slots if s.tokens}

        before = model.engine.run_exclusive(pages)
        long_pages = before[3]
        assert all(before[i] & long_pages for i in range(3)), before  # mixed pages, no free cell left
        assert rt.n_cells_defragmented == 0  # no free page: nothing could move
        generate(model, rng.integers(200, 40000, 3).tolist(), max_tokens=1)  # no cell: an idle slot's KV goes
        after = model.engine.run_exclusive(pages)
        assert model.engine.stats().n_kv_full >= 1
        assert rt.n_cells_defragmented >= 1, (before, after)
        moved = [i for i in range(3) if i in after and before[i] & long_pages and not after[i] & after[3]]
        assert moved, (before, after)
        check = rt.paged_self_check()
        assert check is not None and check.on and check.failures == 0, check
        for i in moved:  # its KV moved to another page: the same prompt, reused, answers as before
            again = generate(model, short[i], max_tokens=1)
            assert again.final.cache.source == "A"
            assert_same_answer(model, again, answers[i])
    finally:
        model.close()
