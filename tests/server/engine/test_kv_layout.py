"""--kv-layout without a model: which layout `auto` takes per backend and why, what refuses to start, the
cells of a split stream, split-stream state blobs, and what a copy between streams costs in the plan."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from pydantic import ValidationError

from server.cache.cost import CostModel, PlanOption
from server.cache.kv_format import (
    SEQ_STATE_MAGIC,
    KVFormatError,
    KVLayout,
    KVSegment,
    count_state_cells,
    parse_seq_state,
    state_blob,
)
from server.engine.kv_layout import KVLayoutUnavailable, choose, model_note, paged_attention_note, stream_cells
from server.settings import ServerSettings


@pytest.mark.parametrize(("backend", "layout"), [(None, "unified"), ("CUDA", "split"), ("CANN", "split"),
                                                 ("Vulkan", "split")])
def test_auto_takes_the_layout_measured_fastest_for_the_backend(backend, layout):
    choice = choose("auto", backend=backend, parallel=4)
    assert choice.layout == layout and choice.asked == "auto"
    assert choice.reason  # /props says why
    if backend == "CUDA":
        assert "H200" in choice.reason and "paged kernels" in choice.reason
    if backend == "CANN":
        assert "no paged-attention kernel" in choice.reason


@pytest.mark.parametrize(("kw", "why"), [({"paged_attn": "on"}, "--paged-attn on"),
                                         ({"idle_cells": True}, "--cache-idle-cells"),
                                         ({"parallel": 1}, "one slot")])
def test_auto_keeps_the_unified_kv_where_a_setting_needs_it(kw, why):
    choice = choose("auto", backend="CUDA", **{"parallel": 4, **kw})
    assert choice.layout == "unified" and why in choice.reason


def test_a_model_with_window_or_recurrent_layers_refuses_split_and_auto_says_why():
    note = model_note(True, "gemma3 keeps sliding-window attention (n_swa=512)")
    assert note is not None and model_note(False, "llama: full attention") is None
    with pytest.raises(KVLayoutUnavailable, match="--kv-layout split: gemma3"):
        choose("split", backend="CUDA", parallel=4, model_note=note)
    auto = choose("auto", backend="CUDA", parallel=4, model_note=note)
    assert auto.layout == "unified" and auto.reason == note
    assert choose("unified", backend="CUDA", parallel=4, model_note=note).layout == "unified"


def test_asked_layouts_are_taken_as_asked():
    assert choose("split", backend=None, parallel=4).layout == "split"  # on the CPU too, for measuring it
    assert choose("unified", backend="CUDA", parallel=4).layout == "unified"
    with pytest.raises(ValueError):
        choose("paged", backend=None, parallel=4)


def test_paged_attention_is_off_in_split_with_its_reason_on_cann_too():
    assert "unified KV" in paged_attention_note(None)
    assert "CANN has no paged-attention kernel" in paged_attention_note("CANN")


def test_a_split_stream_has_llama_cpps_cells():
    assert stream_cells(8192, 4) == 2048
    assert stream_cells(131072, 8) == 16384
    assert stream_cells(8192, 64) == 256  # 128 padded to 256, as llama.cpp pads n_ctx_seq
    assert stream_cells(3000, 4) == 768


def test_settings_refuse_what_the_split_layout_cannot_do():
    with pytest.raises(ValidationError, match="--paged-attn on pages one unified KV"):
        ServerSettings(kv_layout="split", paged_attn="on")
    with pytest.raises(ValidationError, match="--cache-idle-cells"):
        ServerSettings(kv_layout="split", cache_idle_cells=0)
    assert ServerSettings().kv_layout == "auto"
    assert ServerSettings(kv_layout="split").kv_layout == "split"


LAYOUT = KVLayout(False, (1, 1), (8, 8), (1, 1), (8, 8), (0, 0))


def _segment(pos0: int, n: int) -> KVSegment:
    rng = np.random.default_rng(pos0 + n)
    rows = [rng.integers(0, 255, (n, 8), dtype=np.uint8) for _ in range(4)]
    return KVSegment(LAYOUT, pos0, rows[:2], rows[2:])


def test_a_state_for_a_split_context_carries_every_streams_count():
    seg = _segment(0, 5)
    blob = bytes(state_blob([seg], streams=4))
    magic, _seq, n_stream, n = struct.unpack_from("<IiII", blob, 0)
    assert (magic, n_stream, n) == (SEQ_STATE_MAGIC, 4, 5)
    assert blob[-12:] == bytes(12)  # the three other streams hold nothing
    back = parse_seq_state(blob)
    assert back.blob_streams == 4 and back.n_tokens == 5
    assert all(np.array_equal(a, b) for a, b in zip(back.arrays(), seg.arrays()))
    assert bytes(back.to_state_blob(4)) == blob  # restored as it is into a context of four streams
    unified = bytes(back.to_state_blob(1))  # ...and written anew for a unified one
    assert struct.unpack_from("<I", unified, 8)[0] == 1 and len(unified) == len(blob) - 12
    assert count_state_cells(unified) == 5


def test_a_split_state_whose_cells_are_in_a_later_stream_parses():
    """llama.cpp writes a sequence of stream k with k empty streams before it."""
    body = bytes(state_blob([_segment(3, 4)]))  # magic, seq, 1, n, cells...
    magic, seq, _one = struct.unpack_from("<IiI", body, 0)
    blob = struct.pack("<IiI", magic, seq, 3) + struct.pack("<II", 0, 0) + body[12:]
    seg = parse_seq_state(blob)
    assert (seg.pos0, seg.n_tokens, seg.blob_streams) == (3, 4, 3)
    with pytest.raises(KVFormatError, match="several KV streams"):
        parse_seq_state(struct.pack("<IiI", magic, seq, 2) + body[12:] + body[12:])


def test_cells_are_counted_over_every_stream_of_a_whole_dump():
    a, b = bytes(state_blob([_segment(0, 5)])), bytes(state_blob([_segment(0, 2)]))
    dump = struct.pack("<IiI", SEQ_STATE_MAGIC, -1, 3) + a[12:] + struct.pack("<I", 0) + b[12:]
    assert count_state_cells(dump) == 7


def test_a_copy_between_streams_costs_its_measured_time_whatever_the_prefix():
    costs = CostModel()
    costs.observe_prefill(1000, 1.0)  # 1000 tokens/s
    free = costs.estimate_ms(PlanOption("S", 500), 1000)
    assert costs.estimate_ms(PlanOption("S", 500, copy=True), 1000) == free  # not measured: no cost yet
    costs.copy_ms = 40.0
    assert costs.estimate_ms(PlanOption("S", 500, copy=True), 1000) == pytest.approx(free + 40.0)
    assert costs.estimate_ms(PlanOption("S", 900, copy=True), 1000) == pytest.approx(100.0 + 40.0)
    # a copy that costs more than computing what it saves loses to computing
    costs.copy_ms = 200.0
    plan = costs.choose([PlanOption("S", 100, copy=True)], 1000)
    assert plan.label == "compute"
    assert costs.stats()["stream_copy_ms"] == 200.0


def test_the_split_planner_restores_whole_prefixes_and_costs_s_as_a_copy():
    """Split layout: a stored tier restores from position 0 (a state written into the slot's stream replaces it),
    so it is costed for its whole length; S is a copy between streams, with its cost."""
    from types import SimpleNamespace

    from server.cache.planner import Planner
    from server.cache.tiers import Source
    from tests.server.cache.sim_payload import FakePayload, simulated_tree

    class Host:
        source = Source.H

        def lookup(self, tokens, walk=None):
            span = walk.span("H")
            return SimpleNamespace(length=span.longest, tip=span.tip)

    prompt = list(range(200))
    for copies, restored in ((False, 150 - 60), (True, 150)):
        tree, _ = simulated_tree(bytes_per_token=2)
        with tree.mutex:
            tree.insert(prompt[:150], "H", FakePayload.factory(prompt[:150], 2))
        p = Planner(enabled={Source.A, Source.S, Source.H}, tree=tree, tiers=[Host()], resident=None,  # type: ignore[list-item]
                    route="longest", copies=copies)
        cands = p.candidates(prompt, slot_common=30, live=[(7, prompt[:60] + [999])])
        best, plan = p.plan(cands, len(prompt))
        assert best is not None and best.source is Source.H
        assert plan.option.restore_tokens == restored
        s_only = [c for c in cands if c.source is not Source.H]
        _, s_plan = p.plan(s_only, len(prompt))
        assert s_plan.label == "S" and s_plan.option.copy is copies


def test_a_split_steps_rows_go_in_slot_order_and_its_results_in_the_steps():
    """llama.cpp cuts a split batch into ubatches of consecutive, increasing sequence ids (split_equal): rows out of
    slot order would cost a forward pass per sequence. The runner sends them in slot order and hands each item its
    own result back."""
    from types import SimpleNamespace

    from server.engine.runner import LlamaRunner
    from server.engine.scheduler import StepItem

    for split, want in ((True, [0, 0, 1, 2, 2]), (False, [2, 2, 0, 0, 1])):  # unified: the step's own order
        batches: list[list[int]] = []

        def decode_arrays(tokens, positions, seq_ids, logits, batches=batches):
            batches.append(list(seq_ids))
            return []

        runtime = SimpleNamespace(split=split, n_batch=64, decode_arrays=decode_arrays)
        items = [StepItem(SimpleNamespace(slot=SimpleNamespace(seq_id=sid), prefill_stops=()), toks, 0, sample=False)
                 for sid, toks in ((2, [5, 6]), (0, [7, 8]), (1, [9]))]
        assert LlamaRunner(runtime, None).forward(items) == [None, None, None]  # type: ignore[arg-type]
        assert batches == [want]
