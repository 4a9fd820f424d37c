"""harness/models/synth_swa_hybrid.py: the sliding-window (gemma3) and hybrid (lfm2) models it writes load in
the real engine through Arbor's runtime, decode deterministically with finite logits, and their
per-sequence states have the layout the cache's checkpoints (issue 32) will be built on:

    u32 magic | i32 seq_id | [full-attention section] | partial section

where with flags 0 the full-attention section is the base KV (iSWA: the global layers' cells) or the
attention KV (hybrid), and the partial section, alone under LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY, is the
sliding layers' KV (only the cells inside the window of the sequence's last position) or the
recurrent state (one cell at the last position). A partial checkpoint restored over the full-attention
cells of [0, L) and the later cells removed gives back the logits of the sequence at L."""

from __future__ import annotations

import ctypes
import importlib.util
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader

from harness.models.synth_swa_hybrid import (
    SHAPES,
    HybridShape,
    SWAShape,
    main,
    planned_bytes,
    shape_for,
    tensor_plan,
    write_hybrid_model,
    write_swa_model,
)

SEQ_STATE_MAGIC = 0xAF143CD8
PARTIAL_ONLY = 1  # LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
PROMPT = 100  # tokens of sequence 0's prompt
OTHER = 60  # tokens of sequence 1's, in the same unified KV
MORE = 150  # tokens sequence 0 goes on with past its checkpoint: enough to overwrite its window's cells
NEAR = 20  # of which the first are compared on another sequence (see `measure`)
CHUNK = 75  # tokens per decode (n_batch 128)
F32 = int(GGMLQuantizationType.F32)

llama_cpp_missing = importlib.util.find_spec("llama_cpp") is None
needs_llama_cpp = pytest.mark.skipif(llama_cpp_missing, reason="llama-cpp-python is not installed (scripts/setup.sh)")


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("swa-hybrid")
    return {"gemma3": write_swa_model(out / "gemma3-tiny.gguf", seed=5),
            "lfm2": write_hybrid_model(out / "lfm2-tiny.gguf", seed=5)}


# -- the files ---------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["gemma3", "lfm2"])
def test_file_has_the_planned_tensors_and_metadata(models, arch):
    reader = GGUFReader(str(models[arch]))
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.ggml.")}
    shape = SHAPES[arch, "tiny"]
    assert fields["general.architecture"] == arch
    assert fields[f"{arch}.block_count"] == shape.n_layer
    if isinstance(shape, SWAShape):
        assert fields["gemma3.attention.sliding_window"] == 32
        assert fields["gemma3.attention.sliding_window_pattern"] == 6
        assert shape.swa_layers == [0, 1, 2, 3, 4]
    else:
        assert fields["lfm2.attention.head_count_kv"] == [0, 2, 0, 2]
        assert fields["lfm2.shortconv.l_cache"] == 3
    assert "<|im_start|>" in fields["tokenizer.chat_template"]  # SmolLM2's ChatML
    tensors = {t.name: t for t in reader.tensors}
    plan = tensor_plan(shape)
    assert set(tensors) == {t.name for t in plan}
    for t in plan:
        assert tuple(int(d) for d in tensors[t.name].shape[::-1]) == t.shape  # ggml ne reversed
        expected = GGMLQuantizationType.Q8_0 if t.kind == "weight" else GGMLQuantizationType.F32
        assert tensors[t.name].tensor_type == expected, t.name
    assert models[arch].stat().st_size < 8 << 20


def test_presets():
    for arch in ("gemma3", "lfm2"):
        assert 200 << 20 < planned_bytes(shape_for(arch, "bench", tokenizer="smollm2"), "q8_0") < 600 << 20
    bench = shape_for("gemma3", "bench")
    assert isinstance(bench, SWAShape) and bench.tokenizer == "gemma-4" and bench.n_swa == 512
    assert len(bench.swa_layers) == 20
    assert shape_for("gemma3", "tiny", n_swa=64).n_swa == 64  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="sliding and global"):
        SWAShape(n_layer=4, n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_ff=128, n_swa=32,
                 swa_pattern=8).validate()
    with pytest.raises(ValueError, match="attn_layers"):
        HybridShape(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, attn_layers=(0, 1)).validate()
    with pytest.raises(ValueError, match="no preset"):
        shape_for("lfm2", "huge")


def test_cli_refuses_bad_arguments(tmp_path, capsys):
    assert main(["--arch", "lfm2", "--n-swa", "16", "--out", str(tmp_path / "x.gguf")]) == 2
    assert "gemma3 only" in capsys.readouterr().err
    assert not (tmp_path / "x.gguf").exists()
    assert main(["--list"]) == 0
    assert "lfm2" in capsys.readouterr().out


# -- the state blobs ---------------------------------------------------------------------------

@dataclass(frozen=True)
class KVSection:
    """One llama_kv_cache::state_write: u32 n_stream, then per stream u32 cell_count and, if any,
    the cells' (i32 pos, u32 n_seq_id, n_seq_id x i32 seq) and the K rows then V rows per layer."""

    positions: tuple[int, ...]  # in cell order
    n_layer: int
    k_row_bytes: tuple[int, ...]
    v_trans: bool
    nbytes: int


@dataclass(frozen=True)
class RecurrentSection:
    """One llama_memory_recurrent::state_write: u32 cell_count, cells (i32 pos, u32 n_seq_id = 0 for
    one sequence), u32 s_trans, u32 n_layer (all the model's layers), then per recurrent layer
    (i32 type, u64 row bytes, rows) of R (conv) state, then of S (ssm) state."""

    positions: tuple[int, ...]
    n_layer_field: int
    r_row_bytes: tuple[int, ...]
    s_row_bytes: tuple[int, ...]
    nbytes: int


def _u(fmt: str, buf: bytes, off: int) -> tuple[tuple, int]:
    return struct.unpack_from("<" + fmt, buf, off), off + struct.calcsize("<" + fmt)


def parse_kv_section(buf: bytes, off: int) -> tuple[KVSection, int]:
    start = off
    (n_stream,), off = _u("I", buf, off)
    assert n_stream == 1  # unified KV
    (cells,), off = _u("I", buf, off)
    if cells == 0:
        return KVSection((), 0, (), False, off - start), off
    positions = []
    for _ in range(cells):
        (pos, n_seq), off = _u("iI", buf, off)
        assert n_seq == 1
        off += 4 * n_seq
        positions.append(pos)
    (v_trans, n_layer), off = _u("II", buf, off)
    k_rows = []
    for _ in range(n_layer):
        (_, row), off = _u("iQ", buf, off)
        k_rows.append(row)
        off += row * cells
    for _ in range(n_layer):
        if v_trans:
            (_, el, n_embd_v), off = _u("iII", buf, off)
            off += el * n_embd_v * cells
        else:
            (_, row), off = _u("iQ", buf, off)
            off += row * cells
    assert off <= len(buf)
    return KVSection(tuple(positions), n_layer, tuple(k_rows), bool(v_trans), off - start), off


def parse_recurrent_section(buf: bytes, off: int, n_recurrent: int) -> tuple[RecurrentSection, int]:
    start = off
    (cells,), off = _u("I", buf, off)
    positions = []
    for _ in range(cells):
        (pos, n_seq), off = _u("iI", buf, off)
        assert n_seq == 0  # one sequence's state carries no seq ids
        positions.append(pos)
    (s_trans, n_layer), off = _u("II", buf, off)
    assert s_trans == 0
    rows: dict[str, list[int]] = {"r": [], "s": []}
    for kind in ("r", "s"):
        for _ in range(n_recurrent):
            (ty, row), off = _u("iQ", buf, off)
            assert ty == F32
            rows[kind].append(row)
            off += row * cells
    assert off <= len(buf)
    return RecurrentSection(tuple(positions), n_layer, tuple(rows["r"]), tuple(rows["s"]), off - start), off


def parse_header(buf: bytes, seq_id: int) -> int:
    (magic, seq), off = _u("Ii", buf, 0)
    assert (magic, seq) == (SEQ_STATE_MAGIC, seq_id)
    return off


# -- the engine --------------------------------------------------------------------------------

def open_runtime(path: Path, *, swa_full: bool = True):
    """Arbor's runtime on the model (one thread: the cores are shared). `swa_full=False` swaps in a
    context whose sliding layers keep only n_swa * n_seq_max + n_ubatch cells (llama-server's default;
    llama.cpp's context default, which the runtime keeps, is the full size)."""
    import llama_cpp

    from server.engine.llama_runtime import LlamaRuntime, RuntimeConfig

    config = RuntimeConfig(path, n_ctx=1024, n_batch=128, n_seq_max=3, n_threads=1, n_threads_batch=1,
                           kv_unified=True, paged_attn="off")
    rt = LlamaRuntime(config)
    if not swa_full:
        cparams = llama_cpp.llama_context_default_params()
        for field in ("n_ctx", "n_batch", "n_ubatch", "n_seq_max", "n_threads", "n_threads_batch"):
            setattr(cparams, field, {"n_ubatch": config.n_batch}.get(field, getattr(config, field, None)))
        cparams.kv_unified = True
        cparams.no_perf = True
        cparams.swa_full = False
        ctx = llama_cpp.llama_init_from_model(rt.model, cparams)
        assert ctx
        llama_cpp.llama_free(rt.ctx)
        rt.ctx, rt.memory = ctx, llama_cpp.llama_get_memory(ctx)
    return rt


def prompts(n_vocab: int) -> tuple[list[int], list[int]]:
    rng = np.random.default_rng(11)
    return rng.integers(3, n_vocab, PROMPT + MORE).tolist(), rng.integers(3, n_vocab, OTHER).tolist()


def run(rt, tokens: list[int], seq: int, pos0: int = 0) -> np.ndarray:
    """Decode `tokens` at pos0.. on `seq` in batches of CHUNK; the last position's logits."""
    from server.engine.llama_runtime import BatchEntry

    for start in range(0, len(tokens), CHUNK):
        part = tokens[start:start + CHUNK]
        rt.decode([BatchEntry(t, pos0 + start + i, seq, i == len(part) - 1) for i, t in enumerate(part)])
    return np.array(rt.logits_matrix(1)[0])


def state(rt, seq: int, flags: int) -> bytes:
    import llama_cpp

    size = llama_cpp.llama_state_seq_get_size_ext(rt.ctx, seq, flags)
    buf = (ctypes.c_uint8 * size)()
    assert llama_cpp.llama_state_seq_get_data_ext(rt.ctx, buf, size, seq, flags) == size
    return bytes(buf)


def restore(rt, blob: bytes, seq: int, flags: int) -> None:
    import llama_cpp

    buf = (ctypes.c_uint8 * len(blob)).from_buffer_copy(blob)
    assert llama_cpp.llama_state_seq_set_data_ext(rt.ctx, buf, len(blob), seq, flags) == len(blob)


@pytest.mark.model
@needs_llama_cpp
@pytest.mark.parametrize("arch", ["gemma3", "lfm2"])
def test_loads_and_decodes_deterministically(models, arch):
    outs = []
    for _ in range(2):
        rt = open_runtime(models[arch])
        try:
            assert rt.info.architecture == arch
            if arch == "gemma3":
                assert rt.info.n_swa == 32 and not rt.info.is_hybrid and not rt.info.is_recurrent
            else:
                assert rt.info.n_swa == 0 and rt.info.is_hybrid and not rt.info.is_recurrent
            assert "<|im_start|>" in (rt.info.chat_template or "")
            a, _ = prompts(rt.n_vocab)
            outs.append(run(rt, a[:PROMPT], 0))
        finally:
            rt.close()
    assert np.isfinite(outs[0]).all() and outs[0].std() > 0.01
    np.testing.assert_array_equal(outs[0], outs[1])


def measure(path: Path, arch: str, *, swa_full: bool = True) -> dict:
    """Sequence 0 takes a 100-token prompt, sequence 1 a 60-token one; both states are read with
    flags 0 and PARTIAL_ONLY; then sequence 0 goes on 150 tokens (`reference`: the last logits), is
    rolled back to 100 without a checkpoint (`unrestored`: None where seq_rm refuses), then with its
    partial checkpoint (restored, then the cells from 100 on removed, as llama-server does) and decodes
    the same 150 again (`rolled_back`); and its full state, restored into sequence 2, decodes them
    as well (`restored`, compared at the NEAR-th token: on the gemma3 model, with a third sequence's
    cells in the unified KV, two sequences given the same tokens drift apart by ~1e-2 in logits after
    ~100 tokens whether the state was restored or prefilled, with flash attention on or off and with a
    window that never binds; the llama and lfm2 models agree bit for bit)."""
    rt = open_runtime(path, swa_full=swa_full)
    try:
        a, b = prompts(rt.n_vocab)
        run(rt, a[:PROMPT], 0)
        run(rt, b, 1)
        blobs = {(seq, flags): state(rt, seq, flags) for seq in (0, 1) for flags in (0, PARTIAL_ONLY)}
        def go_on(seq: int) -> tuple[np.ndarray, np.ndarray]:  # the same batches each time
            return run(rt, a[PROMPT:PROMPT + NEAR], seq, PROMPT), run(rt, a[PROMPT + NEAR:], seq, PROMPT + NEAR)

        reference = go_on(0)[0]
        after_rm = unrestored = None
        if rt.seq_rm(0, PROMPT, -1):  # rolled back without a checkpoint: what the window still holds
            after_rm = state(rt, 0, PARTIAL_ONLY)
            unrestored = go_on(0)[0]
        restore(rt, blobs[0, PARTIAL_ONLY], 0, PARTIAL_ONLY)
        assert rt.seq_rm(0, PROMPT, -1)
        assert rt.seq_pos_max(0) == PROMPT - 1
        rolled_back = go_on(0)[0]
        restore(rt, blobs[0, 0], 2, 0)
        restored = run(rt, a[PROMPT:PROMPT + NEAR], 2, PROMPT)
        return {"blobs": blobs, "after_rm": after_rm, "reference": reference, "unrestored": unrestored,
                "rolled_back": rolled_back, "restored": restored}
    finally:
        rt.close()


@pytest.mark.model
@needs_llama_cpp
@pytest.mark.parametrize("swa_full", [True, False], ids=["swa-full", "swa-window"])
def test_swa_state_layout_and_checkpoint(models, swa_full):
    got = measure(models["gemma3"], "gemma3", swa_full=swa_full)
    blobs = got["blobs"]
    # head_dim 16 x 2 KV heads, F16: 64 bytes per K row and per V row
    for seq, n in ((0, PROMPT), (1, OTHER)):
        full, partial = blobs[seq, 0], blobs[seq, PARTIAL_ONLY]
        off = parse_header(full, seq)
        base, off = parse_kv_section(full, off)
        swa, off = parse_kv_section(full, off)
        assert off == len(full)
        assert sorted(base.positions) == list(range(n)) and base.n_layer == 1  # layer 5, global
        assert base.k_row_bytes == (64,) and not base.v_trans
        # the sliding layers keep the window of the last position: [n - 32, n)
        assert sorted(swa.positions) == list(range(n - 32, n)) and swa.n_layer == 5
        # PARTIAL_ONLY is the header and the sliding section, byte for byte
        assert partial == full[:8] + full[8 + base.nbytes:]
        assert len(partial) == 8 + 4 + 4 + 32 * 12 + 8 + 5 * 2 * (12 + 32 * 64)
    # without a checkpoint, seq_rm(0, 100, -1) is accepted either way (llama.cpp never refuses it on iSWA);
    # the sliding layers keep the window [68, 100) for sure only if they keep every cell (a window-sized
    # cache reuses masked cells when it runs out: here, 256 cells, it had not reached those yet)
    assert got["after_rm"] is not None
    kept, _ = parse_kv_section(got["after_rm"], parse_header(got["after_rm"], 0))
    assert set(kept.positions) <= set(range(PROMPT - 32, PROMPT))
    if swa_full:
        assert len(kept.positions) == 32
    np.testing.assert_allclose(got["rolled_back"], got["reference"], atol=1e-4)
    # into another sequence: the cells land elsewhere in the unified KV, and this model drifts by ~1e-2
    assert np.abs(got["restored"] - got["reference"]).max() < 0.05
    assert got["restored"].argmax() == got["reference"].argmax()


@pytest.mark.model
@needs_llama_cpp
def test_hybrid_state_layout_and_checkpoint(models):
    got = measure(models["lfm2"], "lfm2")
    blobs = got["blobs"]
    shape = SHAPES["lfm2", "tiny"]
    for seq, n in ((0, PROMPT), (1, OTHER)):
        full, partial = blobs[seq, 0], blobs[seq, PARTIAL_ONLY]
        off = parse_header(full, seq)
        attn, off = parse_kv_section(full, off)
        recr, off = parse_recurrent_section(full, off, n_recurrent=2)
        assert off == len(full)
        assert sorted(attn.positions) == list(range(n)) and attn.n_layer == 2  # layers 1 and 3
        # one recurrent cell at the last position; the conv state is (l_cache - 1) x n_embd F32 per layer,
        # the (unused) ssm state rows are empty; the n_layer field counts every layer of the model
        assert recr.positions == (n - 1,) and recr.n_layer_field == shape.n_layer
        assert recr.r_row_bytes == (2 * 64 * 4,) * 2 and recr.s_row_bytes == (0, 0)
        assert partial == full[:8] + full[8 + attn.nbytes:]
        assert len(partial) == 8 + 4 + 8 + 8 + 2 * (12 + 512) + 2 * 12 == 1100
    assert got["unrestored"] is None  # a recurrent state cannot be cut back by seq_rm: only a checkpoint
    np.testing.assert_allclose(got["rolled_back"], got["reference"], atol=1e-4)
    np.testing.assert_allclose(got["restored"], got["reference"], atol=1e-4)


