"""What speculative decoding runs with: llama-server's --spec-* settings, and Arbor's choice of a default.

`types` are llama-server's --spec-type names (libarbor-spec hands them to llama.cpp, which knows them), or
`auto`: the drafter the benchmarks chose as the default (docs/benchmarks.md, "Speculative decoding"), with the
adaptive policy deciding, per sequence and step, whether a draft pays. `none` drafts nothing. The numbers keep
llama.cpp's defaults unless set; a request may lower n_max (or turn drafting off with 0) for itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# What `auto` drafts with: an n-gram drafter over the sequence's own history, which needs no second model and
# drafts where agents spend their decode (a file written back, a tool result quoted, JSON arguments copying
# earlier context); the adaptive policy turns it off per sequence where it does not pay.
AUTO_TYPES = ("ngram-map-k",)
# The draft types that need a draft model (--spec-draft-model).
MODEL_TYPES = frozenset({"draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark"})
# Those that draft from the target's hidden states, which Arbor's engine does not hand to a drafter (refused).
HIDDEN_STATE_TYPES = frozenset({"draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark"})
HIDDEN_STATE_REASON = ("drafts from the target's hidden states, which Arbor's engine does not hand to a drafter yet: "
                       "use draft-simple or an n-gram type")
# Every --spec-type name: llama.cpp's (the pinned release's common/speculative.cpp; a test holds this list against
# libarbor-spec's arbor_spec_all_types) and Arbor's `auto`.
SPEC_TYPE_NAMES = ("auto", "none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark",
                   "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
_UNSET = (None, None, None)


@dataclass(frozen=True)
class SpecConfig:
    types: tuple[str, ...] = ("auto",)
    # decide per sequence and step whether a draft pays (acceptance seen, rows' cost measured); False drafts
    # whenever the drafter finds one, as llama-server does
    adaptive: bool = True
    draft_n_max: int | None = None  # None: llama.cpp's default for each
    draft_n_min: int | None = None
    draft_p_min: float | None = None
    # the n-gram drafters' numbers, each None for llama.cpp's default
    ngram_simple: tuple[int | None, ...] = _UNSET  # size-n, size-m, min-hits
    ngram_map_k: tuple[int | None, ...] = _UNSET
    ngram_map_k4v: tuple[int | None, ...] = _UNSET
    ngram_mod: tuple[int | None, ...] = _UNSET  # n-match, n-min, n-max
    ngram_cache_static: Path | None = None
    ngram_cache_dynamic: Path | None = None
    draft_model: Path | None = None
    draft_gpu_layers: int = 0
    draft_threads: int | None = None  # None: the target's

    @property
    def resolved_types(self) -> tuple[str, ...]:
        """The llama.cpp names drafted with (`auto` resolved; empty: no drafting)."""
        names: list[str] = []
        for name in self.types:
            for resolved in (AUTO_TYPES if name == "auto" else (name,)):
                if resolved not in names:
                    names.append(resolved)
        if "none" in names:
            return ()
        return tuple(names)

    @property
    def needs_model(self) -> bool:
        return any(t in MODEL_TYPES for t in self.resolved_types)
