"""The KV layout: one unified KV for every sequence, or a KV stream per slot (`--kv-layout`).

- `unified`: one stream of cells shared by every sequence (llama-server's `--kv-unified`). A
  prefix is shared in place: `seq_cp` adds a sequence id to the cells another sequence holds
  (resident owners, parked write-backs, other slots' prefixes; tier S costs no copy), and paged
  attention (docs/paged-attention.md) makes each sequence's attention read only its own pages.
- `split`: a stream of `--ctx-size / --parallel` cells per sequence id (llama-server without
  `--kv-unified`; llama.cpp pads a stream to 256 cells), each slot's attention reading its own
  stream with llama.cpp's dense kernels. A prefix another stream holds is *copied* (tier S
  becomes "copy from device": llama.cpp copies a whole stream between streams, cells and all,
  when the next batch is computed, and the copy is trimmed to the prefix), at a cost of its own
  in the router's cost model; a restore from host, disk or the shared store writes into the
  slot's own stream. Every extra sequence id costs a whole stream of cells, so the split layout
  keeps the slots and as many resident-owner streams as `--resident-cells` pays for, and no
  scratch or parked sequences (reads and restores go straight to the slot's stream; a slot is
  written back at once). Paged attention pages one unified KV: it is off here.
- `auto`: the layout measured fastest for the backend the KV is computed on (`choose`).

`choose` is pure: the backend and the model's memory in, the layout and why out. A layout the
model cannot take refuses to start (KVLayoutUnavailable, naming --kv-layout); `auto` never
refuses, it says why it chose.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Layout = Literal["unified", "split"]
LAYOUTS = ("auto", "unified", "split")
LLAMA_STREAM_PAD = 256  # llama.cpp pads a split stream's cells to this (llama-context.cpp, n_ctx_seq)

# What the measurements say (docs/benchmarks.md, docs/benchmark-notes.md):
CPU_REASON = ("the KV is computed by the CPU backend, where the unified KV with paged attention (each sequence "
              "reading only its own pages) measured at or above llama.cpp's split streams at seed 002's shape, "
              "and shares prefixes without copying them")
CUDA_REASON = ("layers run on {backend}, where llama.cpp's dense kernels over a stream per slot (llama-server's "
               "split KV) measured 2.7x the decode and 0.45x the TTFT of arbor-server's unified KV at seed 002's "
               "shape (an H200, docs/benchmarks.md), and the paged kernels do not beat them there yet")
NO_PAGED_KERNEL_REASON = ("layers run on {backend}, which has no paged-attention kernel: without one, every "
                          "sequence of a unified KV attends over every cell in use, and a stream per slot reads "
                          "only its own")


class KVLayoutUnavailable(RuntimeError):
    """The --kv-layout asked for cannot serve this model or these settings; the server refuses to start."""


@dataclass(frozen=True)
class KVLayoutChoice:
    """The layout in force, what was asked (`--kv-layout`) and why this one."""

    layout: Layout
    asked: str
    reason: str

    @property
    def split(self) -> bool:
        return self.layout == "split"


def stream_cells(ctx_size: int, parallel: int) -> int:
    """The cells of one split stream: --ctx-size shared evenly by the slots, padded as llama.cpp pads it."""
    share = max(1, ctx_size // parallel)
    return -(-share // LLAMA_STREAM_PAD) * LLAMA_STREAM_PAD


def paged_attention_note(backend: str | None) -> str:
    """Why paged attention is off in the split layout (/props arbor.paged_attention.note)."""
    note = ("the split KV layout (--kv-layout) gives each slot a KV stream of its own, which llama.cpp's dense "
            "kernels read without other sequences' cells; paged attention pages one unified KV")
    if backend == "CANN":
        note += " (and CANN has no paged-attention kernel)"
    return note


def choose(asked: str, *, backend: str | None, parallel: int, paged_attn: str = "auto", idle_cells: bool = False,
           model_note: str | None = None) -> KVLayoutChoice:
    """The layout for `asked` (--kv-layout). `backend`: the ggml backend the layers are offloaded to (None: the
    CPU computes the KV); `paged_attn`: --paged-attn; `idle_cells`: --cache-idle-cells is set; `model_note`: why
    this model cannot take the split layout (None: it can)."""
    if asked not in LAYOUTS:
        raise ValueError(f"unknown KV layout {asked!r}; choose among {', '.join(LAYOUTS)}")
    if asked == "unified":
        return KVLayoutChoice("unified", asked, "asked for (--kv-layout unified)")
    if asked == "split":
        if model_note:
            raise KVLayoutUnavailable(f"--kv-layout split: {model_note}; use --kv-layout unified or auto")
        return KVLayoutChoice("split", asked, "asked for (--kv-layout split)")
    # auto: what the measurements say, unless a setting or the model needs the unified KV
    if model_note:
        return KVLayoutChoice("unified", asked, model_note)
    if paged_attn == "on":
        return KVLayoutChoice("unified", asked, "--paged-attn on asks for paged attention, which pages one unified KV")
    if idle_cells:
        return KVLayoutChoice("unified", asked, "--cache-idle-cells bounds the idle cells of the unified KV")
    if parallel == 1:
        return KVLayoutChoice("unified", asked, "one slot: a single stream either way, and resident prefixes share "
                                                "its cells instead of a stream each")
    if backend is None:
        return KVLayoutChoice("unified", asked, CPU_REASON)
    if backend == "CUDA":
        return KVLayoutChoice("split", asked, CUDA_REASON.format(backend=backend))
    return KVLayoutChoice("split", asked, NO_PAGED_KERNEL_REASON.format(backend=backend))


def model_note(needs_checkpoints: bool, describe: str) -> str | None:
    """Why a model cannot take the split layout: one with sliding-window or recurrent layers keeps state
    checkpoints (server/cache/checkpoints.py), which restore over a sequence's cells in place; Arbor keeps them
    in the unified layout only."""
    if not needs_checkpoints:
        return None
    return (f"{describe}, whose state checkpoints Arbor restores in the unified KV only (the split layout is for "
            "full-attention models here)")
