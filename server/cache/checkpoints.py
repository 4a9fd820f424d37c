"""State checkpoints: what a model with sliding-window or recurrent layers needs, besides its
full-attention KV, to resume from an earlier position.

A full-attention layer keeps the K/V of every position, so its KV can be cut back to any prefix
(`seq_rm`). Two kinds of layer cannot:
- a sliding-window layer (Gemma 2/3, gpt-oss, Cohere2: `n_swa` > 0) keeps only the cells its
  window still reaches; cutting the sequence back to position n needs the cells
  [n - n_swa, n), which are gone once the sequence has moved a window past them;
- a recurrent layer (Mamba, RWKV, the delta-net / conv layers of Qwen3.5, Qwen3-Next, LFM2,
  Granite 4 hybrid) keeps one state, at the sequence's end; it cannot be cut back at all.

A checkpoint is that part of a sequence's state at one position, as llama.cpp itself saves it
for llama-server's context checkpoints: `llama_state_seq_get_data_ext(...,
LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)` (the SWA layers' cells, or the recurrent state; never the
full-attention KV). Restoring it with the same flag replaces the sequence's partial state;
the full-attention KV is then cut back to the checkpoint's position with `seq_rm`.

Contracts:
- `ModelMemory.can_cut(runtime, seq_id, n, held)`: whether a sequence holding `held` tokens can be
  cut back to its first n tokens with `seq_rm` alone (no checkpoint needed).
- `SlotCheckpoints` keeps one slot's checkpoints, each valid only for the slot's own token path
  up to its position: `forget_after(n)` drops those past a cut, `clear()` all of them when the
  slot is emptied. At most `limit` are kept (the oldest beyond it go first, as llama-server's
  `--ctx-checkpoints`).
- `stops(prompt_len, reused, every)`: the prompt positions where a prefill chunk ends so a
  checkpoint can be taken: every `every` tokens and one before the prompt's last token (a
  repeat or a retry of the same prompt reuses all but that token, as every request computes
  its last prompt token for logits); `turn_starts` adds where turns begin (as llama-server
  checkpoints at user messages), read from the template's control tokens.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol


class _Runtime(Protocol):
    def seq_pos_min(self, seq_id: int) -> int: ...

    def seq_pos_max(self, seq_id: int) -> int: ...


@dataclass(frozen=True)
class ModelMemory:
    """What of a sequence's state a model can cut back (from llama.cpp's model info)."""

    architecture: str
    n_swa: int  # sliding window of the SWA layers (0: none)
    recurrent: bool  # recurrent layers (pure recurrent or hybrid models)

    @classmethod
    def of(cls, info, *, swa_full: bool = False) -> ModelMemory:
        """From llama.cpp's model info; `swa_full`: the context's window layers keep every cell
        (then they cut back like full attention)."""
        return cls(info.architecture, 0 if swa_full else int(info.n_swa), bool(info.is_recurrent or info.is_hybrid))

    @property
    def needs_checkpoints(self) -> bool:
        return self.recurrent or self.n_swa > 0

    def describe(self) -> str:
        parts = (["recurrent state"] if self.recurrent else []) + (
            [f"sliding-window attention (n_swa={self.n_swa})"] if self.n_swa > 0 else [])
        return f"{self.architecture} keeps " + " and ".join(parts) if parts else f"{self.architecture}: full attention"

    def can_cut(self, runtime: _Runtime, seq_id: int, n: int, held: int) -> bool:
        """Whether the first n of the `held` tokens the sequence holds are a resumable state
        once the rest is removed with `seq_rm` (n <= held)."""
        if n <= 0 or n > held:
            return False
        if self.recurrent and n != held:
            return False  # the recurrent state exists only at the sequence's end
        if self.n_swa > 0 and n < held:
            # the next token, at position n, attends to (n - n_swa, n): those cells must still be
            # there; the window layers keep a suffix of the sequence, from seq_pos_min on
            return 0 <= runtime.seq_pos_min(seq_id) <= max(0, n - self.n_swa)
        return True


@dataclass(frozen=True)
class StateCheckpoint:
    """The partial state of a sequence that held exactly its first `pos` tokens."""

    pos: int
    blob: bytes

    @property
    def nbytes(self) -> int:
        return len(self.blob)


class SlotCheckpoints:
    """One slot's checkpoints by position, oldest first."""

    def __init__(self, limit: int):
        self.limit = limit
        self._by_pos: OrderedDict[int, StateCheckpoint] = OrderedDict()

    def __len__(self) -> int:
        return len(self._by_pos)

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self._by_pos.values())

    def positions(self) -> list[int]:
        return sorted(self._by_pos)

    def all(self) -> list[StateCheckpoint]:
        """Every checkpoint, by position."""
        return [self._by_pos[p] for p in sorted(self._by_pos)]

    def add(self, ckpt: StateCheckpoint) -> None:
        self._by_pos.pop(ckpt.pos, None)  # a newer one at the same position supersedes it
        self._by_pos[ckpt.pos] = ckpt
        while len(self._by_pos) > self.limit:
            self._by_pos.popitem(last=False)

    def newest_at_or_below(self, n: int) -> StateCheckpoint | None:
        """The checkpoint at the highest position <= n (the longest prefix it resumes)."""
        best = max((p for p in self._by_pos if p <= n), default=None)
        return None if best is None else self._by_pos[best]

    def forget_after(self, n: int) -> None:
        """The slot now holds only its first n tokens: later checkpoints no longer apply."""
        for p in [p for p in self._by_pos if p > n]:
            del self._by_pos[p]

    def clear(self) -> None:
        self._by_pos.clear()


def stops(prompt_len: int, reused: int, every: int) -> tuple[int, ...]:
    """Prompt positions after `reused` (exclusive) and before the prompt's end where a prefill
    chunk ends for a checkpoint (see the module's contract)."""
    last = prompt_len - 1
    out = set(range(every, last, every)) if every > 0 else set()
    if last > 0:
        out.add(last)
    return tuple(sorted(p for p in out if p > reused))


def turn_starts(prompt: Sequence[int], is_control: Callable[[int], bool], keep_last: int = 3) -> tuple[int, ...]:
    """Where the prompt's turns begin, as far as its tokens say: a control token (a template's turn
    marker) after ordinary ones; a marker pair (end of one turn, start of the next) counts once.
    The first (the end of the system prompt and tools: the branch point of every conversation
    under them) and the last `keep_last` (a retried or forked turn)."""
    out: list[int] = []
    prev_control = True  # the prompt's own opening marker is no boundary
    for i, tok in enumerate(prompt):
        control = is_control(tok)
        if control and not prev_control and (not out or i - out[-1] > 3):
            out.append(i)
        prev_control = control
    return tuple(dict.fromkeys(out[:1] + out[-keep_last:])) if out else ()
