"""A sequence state staged, then written beside the compute (native/src/llama-state-staged.h, through LlamaRuntime) on
the real engine: the cells exist at once, the written KV is the saved one and predicts what the original predicted,
another sequence decodes while the write runs, a state that does not fit is refused leaving nothing, a call that
frees or moves the cells being written waits for the write, and a runtime whose kernels may read masked cells refuses
to stage. The mirror, a state snapshotted then read beside the compute: the bytes llama_state_seq_get_data gives,
while another sequence decodes, and freeing the cells waits for the read."""

from __future__ import annotations

import numpy as np
import pytest

from tests.server.engine.test_paged_attention_real import runtime

pytestmark = pytest.mark.model

TEXT = "The pump in hall three tripped twice last night; the shift log says the pressure sensor drifted."


def fill(rt, seq_id: int, tokens: list[int]) -> int:
    """Decode `tokens` into `seq_id` from position 0; the top token after them."""
    from server.engine.llama_runtime import BatchEntry

    (row,) = rt.decode([BatchEntry(t, i, seq_id, i == len(tokens) - 1) for i, t in enumerate(tokens)])
    return int(np.argmax(np.ctypeslib.as_array(rt.logits_row(row))))


def fill_one(rt, seq_id: int, token: int, pos: int) -> int:
    from server.engine.llama_runtime import BatchEntry

    (row,) = rt.decode([BatchEntry(token, pos, seq_id, True)])
    return int(np.argmax(np.ctypeslib.as_array(rt.logits_row(row))))


def kv_arrays(blob):
    from server.cache.kv_format import parse_seq_state

    seg = parse_seq_state(blob)
    return seg.pos0, seg.n_tokens, [np.array(a) for a in seg.arrays()]


def test_a_staged_state_holds_the_saved_kv_once_written_and_predicts_the_same():
    rt = runtime("on")
    try:
        assert rt.stages_beside_compute
        tokens = rt.tokenize(TEXT, add_special=True, parse_special=False)
        top = fill(rt, 0, tokens)
        saved = bytes(rt.state_seq_get(0))
        other = rt.tokenize("A poem about pumps:", add_special=True, parse_special=False)
        fill(rt, 2, other)
        staged = rt.stage_state(saved, 1)
        assert staged is not None and staged.n_bytes > 0
        assert rt.seq_pos_max(1) == len(tokens) - 1  # the cells exist before their K and V are written
        written = rt.write_staged(staged, {1})
        # another sequence decodes while the write may still run (it never reads seq 1's cells)
        fill_one(rt, 2, 7, len(other))
        assert written.result(timeout=30) >= 0
        assert kv_arrays(rt.state_seq_get(1))[:2] == (0, len(tokens))
        for got, want in zip(kv_arrays(rt.state_seq_get(1))[2], kv_arrays(saved)[2], strict=True):
            np.testing.assert_array_equal(got, want)
        rt.seq_rm(1, len(tokens) - 1, -1)  # the last token again, from the staged KV: the same prediction
        assert fill_one(rt, 1, tokens[-1], len(tokens) - 1) == top
    finally:
        rt.close()


def test_a_call_on_the_written_cells_waits_for_their_write():
    rt = runtime("on")
    try:
        tokens = rt.tokenize(TEXT * 8, add_special=True, parse_special=False)
        fill(rt, 0, tokens)
        saved = bytes(rt.state_seq_get(0))
        written = rt.write_staged(rt.stage_state(saved, 1), {1})
        rt.seq_rm(1, len(tokens) - 1, -1)  # frees one of the cells being written: only after the write
        assert written.done()
        assert rt.seq_pos_max(1) == len(tokens) - 2
        written = rt.write_staged(rt.stage_state(saved, 2), {2})
        rt.state_seq_get(-1)  # reads every cell: after every write
        assert written.done()
    finally:
        rt.close()


def test_a_state_that_does_not_fit_is_refused_and_leaves_nothing():
    rt = runtime("on", n_ctx=256, n_seq_max=2)
    try:
        assert rt.n_ctx == 256
        tokens = rt.tokenize(TEXT * 10, add_special=True, parse_special=False)[:150]
        fill(rt, 0, tokens)
        saved = bytes(rt.state_seq_get(0))  # 150 cells, with 106 free
        assert rt.stage_state(saved, 1) is None
        assert rt.seq_pos_max(1) == -1
        assert rt.seq_pos_max(0) == len(tokens) - 1
    finally:
        rt.close()


def test_a_runtime_whose_kernels_may_read_masked_cells_refuses_to_stage():
    rt = runtime("off")
    try:
        assert not rt.stages_beside_compute
        with pytest.raises(RuntimeError, match="paged attention on the CPU"):
            rt.stage_state(b"", 1)
        with pytest.raises(RuntimeError, match="paged attention on the CPU"):
            rt.snapshot_state(0)
    finally:
        rt.close()


def test_a_snapshot_read_beside_a_decode_gives_the_bytes_of_a_plain_state_read():
    rt = runtime("on")
    try:
        tokens = rt.tokenize(TEXT * 4, add_special=True, parse_special=False)
        fill(rt, 0, tokens)
        other = rt.tokenize("A poem about pumps:", add_special=True, parse_special=False)
        fill(rt, 2, other)
        want = bytes(rt.state_seq_get(0))
        snap = rt.snapshot_state(0)
        assert snap is not None and snap.size == len(want)
        read = rt.read_snapshot(snap, 0)
        for i in range(3):  # another sequence decodes while the read may still run (it writes only its own cells)
            fill_one(rt, 2, 7 + i, len(other) + i)
        assert bytes(read.result(timeout=30)) == want
        rt.seq_rm(0, -1, -1)
        assert rt.snapshot_state(0) is not None  # an empty sequence's state: its header only
    finally:
        rt.close()


def test_freeing_the_cells_being_read_waits_for_the_read():
    rt = runtime("on")
    try:
        tokens = rt.tokenize(TEXT * 8, add_special=True, parse_special=False)
        fill(rt, 0, tokens)
        want = bytes(rt.state_seq_get(0))
        read = rt.read_snapshot(rt.snapshot_state(0), 0)
        rt.seq_rm(0, -1, -1)  # frees the cells being read: only after the read
        assert read.done() and bytes(read.result()) == want
        assert rt.seq_pos_max(0) == -1
    finally:
        rt.close()
