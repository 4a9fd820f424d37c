"""Quantized KV (`--cache-type-k/-v`, issue 32 item 5) on the real engine (embedded model).

Segments of q8_0, q4_0 and mixed K/V layouts split, join and restore byte for byte into KV that
predicts what computing the prefix predicts (teacher-forced top-1 agreement on at least 99% of the
positions with flash attention, same KV types on both sides); a q8_0 prefix restored from host
RAM (H) and from disk (D) continues greedily as a cache-off q8_0 server does (up to a near-tie);
a q8_0 token costs about half an f16 one in H and D; the tiers' fingerprint carries the KV types,
so a disk directory written with f16 is not read with q8_0 (and is again with f16); paged
attention's CPU kernel agrees with llama.cpp's over q8_0.
"""

from __future__ import annotations

from pathlib import Path

import llama_cpp
import pytest

from tests.cores import model_threads
from tests.server.cache.engine_harness import assert_same_answer, chat_tokens, generate, reset_kv
from tests.server.cache.test_direct_kv_real import prefill, tok
from tests.server.conftest import embedded_model_available

pytestmark = pytest.mark.model

Q8 = dict(cache_type_k="q8_0", cache_type_v="q8_0", flash_attn="on")
F16 = dict(cache_type_k="f16", cache_type_v="f16", flash_attn="on")  # flash on too: only the types differ
SYSTEM = ("You are the assistant of an edge maintenance team. You answer briefly, cite device ids, and never "
          "invent telemetry. Devices: pump-1, pump-2, compressor-7, fan-3. Shifts: day and night.")
QUESTIONS = ["Which device failed last night?", "What does a rising vibration mean?", "Who is on the night shift?"]


def _skip_without_model():
    why = embedded_model_available()
    if why:
        pytest.skip(why)


def load(cache_dir: Path | None, **overrides):
    _skip_without_model()
    from server import bootstrap
    from server.settings import ServerSettings

    kw = dict(parallel=2, ctx_size=2048, batch_size=256, threads=model_threads(), cache_min_tokens=16,
              cache_tiers=("A", "H"))
    if cache_dir is not None:
        kw.update(cache_tiers=("A", "H", "D"), cache_dir=cache_dir)
    kw.update(overrides)
    return bootstrap.load(ServerSettings(**kw))


def _store_trunk(model) -> list[int]:
    """Run a trunk, then drop every device copy: only H (and D) hold it afterwards."""
    trunk = chat_tokens(model, SYSTEM, QUESTIONS[0])
    generate(model, trunk, max_tokens=2)
    reset_kv(model)
    if model.router.disk is not None:
        model.router.disk.wait_idle()
    return trunk


def _tier_bytes_per_token(stats: dict) -> float:
    return stats["bytes"] / stats["tokens"]


@pytest.mark.parametrize("k_type, v_type, flash", [("q8_0", "q8_0", True), ("q4_0", "q4_0", True),
                                                   ("q8_0", "f16", False)])
def test_quantized_segments_split_join_and_restore_like_a_prefill(k_type, v_type, flash):
    """Direct KV over quantized rows (and a quantized K beside a transposed f16 V, flash
    attention off): parse -> split -> join is byte-exact, restored segments put back the very
    bytes that were extracted (compared to the bit), and they predict what a full prefill of the
    same KV types predicts: the teacher-forced top-1 of at least 99% of the positions with flash
    attention, 95% without (73 of 73 in each case on 2026-12-06). Not all of them: the branch is
    computed in other chunks than the whole prompt (its logits differ in their last bits, and on
    this model's quantized activations that can flip a near-tie), and without flash attention
    llama.cpp's matmul attention also sums over the KV in another order where the cells lie
    elsewhere (f16 shows the same logit differences, up to ~0.7 here)."""
    _skip_without_model()
    from server.cache.kv_format import KVSegment, parse_seq_state
    from server.cache.kv_ops import KVOps
    from server.engine.kv_types import GGML_TYPE_IDS
    from server.engine.llama_runtime import LlamaRuntime, RuntimeConfig
    from server.engine.seq_ids import SequenceIdLayout, SequenceIdPool
    from server.model_file import embedded_model_path

    rt = LlamaRuntime(RuntimeConfig(embedded_model_path(), n_ctx=2048, n_batch=256, n_seq_max=6,
                                    n_threads=model_threads(), n_threads_batch=model_threads(), flash_attn=flash,
                                    cache_type_k=k_type, cache_type_v=v_type))
    try:
        kv = KVOps(rt, SequenceIdPool(SequenceIdLayout(slots=3, owners=1, scratch=2)))
        trunk = tok(rt, "<|im_start|>system\nYou are a maintenance assistant for a fleet of pumps and valves. "
                        "Answer with the device id first.<|im_end|>\n")
        prefill(rt, 0, trunk)
        blob = rt.state_seq_get(0)
        seg = parse_seq_state(blob)
        assert seg.layout.v_trans == (not flash)
        assert set(seg.layout.k_types) == {GGML_TYPE_IDS[k_type]} and set(seg.layout.v_types) == {GGML_TYPE_IDS[v_type]}
        left, right = seg.split(7)
        assert bytes(KVSegment.join([left, right]).to_state_blob()) == bytes(blob)
        mid = len(trunk) // 2
        segments = [kv.extract(0, 0, mid), kv.extract(0, mid, len(trunk))]
        agree = total = 0
        for branch in ["<|im_start|>user\nWhich pump is failing, and since when? The night shift logged a pressure "
                       "drop on line 3 and a seal was replaced on pump 2.<|im_end|>\n<|im_start|>assistant\n",
                       "<|im_start|>user\nShow the vibration trend of pump 7 for the last week, with the readings "
                       "above the alarm level and who acknowledged them.<|im_end|>\n<|im_start|>assistant\n"]:
            full = trunk + tok(rt, branch)
            rt.seq_rm(1, -1, -1)
            rt.seq_rm(2, -1, -1)
            reference = prefill(rt, 1, full, logits_from=len(trunk))
            kv.restore(segments, 2)
            assert rt.seq_pos_max(2) == len(trunk) - 1
            restored = parse_seq_state(rt.state_seq_get(2))
            assert all((a == b).all() for a, b in zip(restored.arrays(), seg.arrays(), strict=True))
            cached = prefill(rt, 2, full[len(trunk):], start=len(trunk), logits_from=len(trunk))
            agree += sum(a == b for a, b in zip(reference, cached))
            total += len(reference)
        assert total > 60 and agree / total >= (0.99 if flash else 0.95), (agree, total)
    finally:
        llama_cpp.llama_memory_clear(rt.memory, True)
        rt.close()


def test_q8_0_prefix_from_host_and_disk_continues_as_computing_it(tmp_path):
    reference = load(None, no_cache=True, **Q8)
    try:
        model = load(tmp_path / "kv", **Q8)
        try:
            trunk = _store_trunk(model)
            follow = trunk[:-3] + chat_tokens(model, "", QUESTIONS[1])[3:]
            got = generate(model, follow, max_tokens=12)
            assert got.final.cache.source == "H" and got.final.cache.reused_tokens >= len(trunk) - 10, got.final.cache
            assert_same_answer(reference, got, generate(reference, follow, max_tokens=12))
            assert model.router.disk.stats()["entries"] >= 1
        finally:
            model.close()
        model = load(tmp_path / "kv", **Q8)  # the same directory: D reloaded, H empty
        try:
            assert model.router.disk.stats()["entries"] >= 1 and model.router.disk.foreign_files == 0
            got = generate(model, trunk, max_tokens=12)
            assert got.final.cache.source == "D" and got.final.cache.reused_tokens >= len(trunk) - 10, got.final.cache
            assert_same_answer(reference, got, generate(reference, trunk, max_tokens=12))
        finally:
            model.close()
    finally:
        reference.close()


def test_q8_0_halves_the_bytes_per_token_and_never_reads_f16_files(tmp_path):
    """One disk directory written with f16, then opened with q8_0 (its files are foreign, none is
    restored), then with f16 again (they are read as before)."""
    kv_dir = tmp_path / "kv"
    model = load(kv_dir, **F16)
    try:
        trunk = _store_trunk(model)
        f16_fp = model.router.disk.fingerprint
        f16_host, f16_disk = model.router.host.stats(), model.router.disk.stats()
    finally:
        model.close()
    f16_files = len(list(kv_dir.glob("*.kvseg")))
    assert f16_files >= 1
    model = load(kv_dir, **Q8)
    try:
        disk = model.router.disk
        assert disk.fingerprint != f16_fp
        assert (disk.foreign_files, disk.stats()["entries"]) == (f16_files, 0)
        assert generate(model, trunk, max_tokens=4).final.cache.source != "D"
        reset_kv(model)
        disk.wait_idle()
        q8_host, q8_disk = model.router.host.stats(), disk.stats()
    finally:
        model.close()
    host_ratio = _tier_bytes_per_token(q8_host) / _tier_bytes_per_token(f16_host)
    disk_ratio = _tier_bytes_per_token(q8_disk) / _tier_bytes_per_token(f16_disk)
    print(f"bytes per cached token, q8_0 / f16: H {host_ratio:.3f}, D {disk_ratio:.3f}")
    # q8_0 stores 34 bytes per 32 elements where f16 stores 64: 0.53 (the disk adds a small header per file)
    assert 0.5 <= host_ratio <= 0.56, (q8_host, f16_host)
    assert 0.5 <= disk_ratio <= 0.58, (q8_disk, f16_disk)
    model = load(kv_dir, **F16)  # back to f16: its files are this fingerprint's again, the q8_0 ones foreign
    try:
        assert model.router.disk.fingerprint == f16_fp and model.router.disk.foreign_files >= 1
        assert generate(model, trunk, max_tokens=4).final.cache.source == "D"
    finally:
        model.close()


def test_paged_attention_over_q8_0_predicts_what_unpaged_predicts():
    """The CPU paged kernel's per-row path dequantizes K and V as llama.cpp's own does."""
    _skip_without_model()
    from bench.paged_agreement import agreement
    from server.model_file import embedded_model_path

    result = agreement(embedded_model_path(), page_size=16, threads=model_threads(), cache_type="q8_0")
    assert result["predictions"] > 700
    assert result["agreement"] >= 0.995, result


def test_a_q8_0_server_runs_paged_attention_on_the_cpu():
    model = load(None, **Q8)
    try:
        assert model.runtime.paged_attn.enabled, model.runtime.paged_attn
    finally:
        model.close()
