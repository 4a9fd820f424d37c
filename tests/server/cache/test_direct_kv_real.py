"""Direct KV on the real model: extracted segments split, join and restore into KV that
predicts exactly what a full prefill predicts (teacher-forced top-1 agreement)."""

from __future__ import annotations

import llama_cpp
import numpy as np
import pytest

from tests.cores import model_threads
from tests.server.conftest import embedded_model_available

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def rt():
    why = embedded_model_available()
    if why:
        pytest.skip(why)
    from server.engine.llama_runtime import LlamaRuntime, RuntimeConfig
    from server.model_file import embedded_model_path

    runtime = LlamaRuntime(RuntimeConfig(embedded_model_path(), n_ctx=2048, n_batch=256, n_seq_max=6,
                                         n_threads=model_threads(), n_threads_batch=model_threads()))
    yield runtime
    runtime.close()


@pytest.fixture()
def kv(rt):
    from server.cache.kv_ops import KVOps
    from server.engine.seq_ids import SequenceIdLayout, SequenceIdPool

    pool = SequenceIdPool(SequenceIdLayout(slots=3, owners=1, scratch=2))
    llama_cpp.llama_memory_clear(rt.memory, True)
    yield KVOps(rt, pool)
    assert pool.in_use("scratch") == 0, "a scratch sequence leaked"
    llama_cpp.llama_memory_clear(rt.memory, True)


def prefill(rt, seq, tokens, start=0, logits_from=None):
    """Decode tokens at positions start.. into seq; return top-1 predictions for positions >= logits_from."""
    from server.engine.llama_runtime import BatchEntry

    preds = []
    logits_from = len(tokens) + start if logits_from is None else logits_from
    for i in range(0, len(tokens), 128):
        chunk = tokens[i: i + 128]
        entries = [BatchEntry(t, start + i + j, seq, start + i + j >= logits_from) for j, t in enumerate(chunk)]
        for idx in rt.decode(entries):
            preds.append(int(np.argmax(np.ctypeslib.as_array(rt.logits_row(idx)))))
    return preds


def tok(rt, text):
    return rt.tokenize(text, add_special=False, parse_special=True)


def test_extract_parse_roundtrip_is_byte_exact(rt, kv):
    from server.cache.kv_format import parse_seq_state

    tokens = tok(rt, "The quick brown fox jumps over the lazy dog. " * 3)
    prefill(rt, 0, tokens)
    blob = rt.state_seq_get(0)
    seg = parse_seq_state(blob)
    assert seg.pos0 == 0 and seg.n_tokens == len(tokens)
    assert bytes(seg.to_state_blob()) == bytes(blob)
    left, right = seg.split(10)
    from server.cache.kv_format import KVSegment

    assert bytes(KVSegment.join([left, right]).to_state_blob()) == bytes(blob)
    assert seg.blob is not None and np.shares_memory(seg.k[0], np.frombuffer(blob, np.uint8))  # views, no copy
    part = kv.extract(0, 10, len(tokens))
    assert part.pos0 == 10 and part.n_tokens == len(tokens) - 10
    assert all(np.array_equal(a, b) for a, b in zip(part.k, right.k))


def test_restored_segments_predict_like_a_full_prefill(rt, kv):
    """Store a trunk as two segments from one sequence, restore them into another, and
    continue with different branches: predictions must match full prefills."""
    trunk = tok(rt, "<|im_start|>system\nYou are a maintenance assistant for a fleet of pumps.<|im_end|>\n")
    prefill(rt, 0, trunk)
    mid = len(trunk) // 2
    segments = [kv.extract(0, 0, mid), kv.extract(0, mid, len(trunk))]
    agree = total = 0
    for branch in ["<|im_start|>user\nWhich pump is failing?<|im_end|>\n",
                   "<|im_start|>user\nShow the vibration trend of pump 7.<|im_end|>\n"]:
        full = trunk + tok(rt, branch)
        rt.seq_rm(1, -1, -1)
        rt.seq_rm(2, -1, -1)
        reference = prefill(rt, 1, full, logits_from=len(trunk))
        kv.restore(segments, 2)
        assert rt.seq_pos_max(2) == len(trunk) - 1
        cached = prefill(rt, 2, full[len(trunk):], start=len(trunk), logits_from=len(trunk))
        agree += sum(a == b for a, b in zip(reference, cached))
        total += len(reference)
    assert total > 20 and agree / total >= 0.995, (agree, total)


def test_failed_restore_leaves_the_target_empty(rt, kv):
    from server.cache.kv_ops import RestoreError

    tokens = tok(rt, "A short prefix to store and restore.")
    prefill(rt, 0, tokens)
    seg = kv.extract(0, 0, len(tokens))
    from tests.server.cache.engine_harness import fail_next_restore

    fail_next_restore(rt)
    with pytest.raises(RestoreError):
        kv.restore([seg], 1)
    assert rt.seq_pos_max(1) == -1
    # a layout mismatch (corrupt payload) is refused by llama.cpp, not loaded
    broken = seg.slice(0, seg.n_tokens)
    broken.k[0] = broken.k[0][:, :-2]
    with pytest.raises(RestoreError):
        kv.restore([broken], 1)
    assert rt.seq_pos_max(1) == -1
