"""arbor-server's speculative-decoding flags: llama-server's --spec-* names, and Arbor's adaptive policy.

A mixin of ServerSettings (server/settings.py), kept apart because it is one concern with many flags. Each
field is a flag (server/cli.py builds them) and an ARBOR_SERVER_* variable; the numbers default to None, which
keeps llama.cpp's own default (common_params_speculative), so --help states only what Arbor sets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic.config import JsonDict
from pydantic_settings import BaseSettings

from server.engine.speculative.config import (
    HIDDEN_STATE_REASON,
    HIDDEN_STATE_TYPES,
    MODEL_TYPES,
    SPEC_TYPE_NAMES,
    SpecConfig,
)

_SPEC: JsonDict = {"group": "speculative decoding"}


class SpeculativeSettings(BaseSettings):
    spec_type: tuple[str, ...] = Field(
        ("auto",), description="drafters, comma separated: llama-server's --spec-type names ("
        + ", ".join(n for n in SPEC_TYPE_NAMES if n not in ("auto", "none")) + "), auto (Arbor's default drafter, "
        "docs/server.md) or none. draft-simple needs --spec-draft-model; the types that draft from the target's "
        "hidden states (draft-eagle3, -mtp, -dflash, -dspark) are refused", json_schema_extra=_SPEC)
    spec_policy: Literal["adaptive", "always"] = Field(
        "adaptive", description="adaptive: each sequence drafts only as many tokens as its acceptance and the "
        "measured cost of rows say pay, none where they do not (so drafting by default is never much slower); "
        "always: every draft the drafter finds, at full length (llama-server's behaviour)", json_schema_extra=_SPEC)
    spec_draft_n_max: int | None = Field(None, ge=0, description="most tokens a draft model drafts per step "
                                         "(llama.cpp's default when not given)", json_schema_extra=_SPEC)
    spec_draft_n_min: int | None = Field(None, ge=0, description="fewest tokens of a draft model's draft worth "
                                         "verifying", json_schema_extra=_SPEC)
    spec_draft_p_min: float | None = Field(None, ge=0.0, le=1.0, description="a draft model drafts a token only "
                                           "with at least this probability", json_schema_extra=_SPEC)
    spec_draft_model: Path | None = Field(None, description="the draft model of draft-simple (a GGUF with the "
                                          "target's vocabulary)", json_schema_extra={**_SPEC, "short": "-md"})
    spec_draft_ngl: int = Field(0, ge=-1, description="the draft model's layers on an accelerator (-1: all)",
                                json_schema_extra={**_SPEC, "short": "-ngld"})
    spec_draft_threads: int | None = Field(None, ge=1, description="the draft model's threads (not given: "
                                           "--threads)", json_schema_extra={**_SPEC, "short": "-td"})
    spec_ngram_simple_size_n: int | None = Field(None, ge=1, le=1024, description="ngram-simple: tokens looked up",
                                                 json_schema_extra=_SPEC)
    spec_ngram_simple_size_m: int | None = Field(None, ge=1, le=1024, description="ngram-simple: tokens drafted",
                                                 json_schema_extra=_SPEC)
    spec_ngram_simple_min_hits: int | None = Field(None, ge=1, le=1024, description="ngram-simple: hits before it "
                                                   "drafts", json_schema_extra=_SPEC)
    spec_ngram_map_k_size_n: int | None = Field(None, ge=1, le=1024, description="ngram-map-k: tokens of the key",
                                                json_schema_extra=_SPEC)
    spec_ngram_map_k_size_m: int | None = Field(None, ge=1, le=1024, description="ngram-map-k: tokens drafted",
                                                json_schema_extra=_SPEC)
    spec_ngram_map_k_min_hits: int | None = Field(None, ge=1, le=1024, description="ngram-map-k: hits of a key before "
                                                  "it drafts", json_schema_extra=_SPEC)
    spec_ngram_map_k4v_size_n: int | None = Field(None, ge=1, le=1024, description="ngram-map-k4v: tokens of the key",
                                                  json_schema_extra=_SPEC)
    spec_ngram_map_k4v_size_m: int | None = Field(None, ge=1, le=1024, description="ngram-map-k4v: tokens drafted",
                                                  json_schema_extra=_SPEC)
    spec_ngram_map_k4v_min_hits: int | None = Field(None, ge=1, le=1024, description="ngram-map-k4v: hits before it "
                                                    "drafts", json_schema_extra=_SPEC)
    spec_ngram_mod_n_match: int | None = Field(None, ge=1, le=1024, description="ngram-mod: lookup length",
                                               json_schema_extra=_SPEC)
    spec_ngram_mod_n_min: int | None = Field(None, ge=0, le=1024, description="ngram-mod: fewest tokens drafted",
                                             json_schema_extra=_SPEC)
    spec_ngram_mod_n_max: int | None = Field(None, ge=0, le=1024, description="ngram-mod: most tokens drafted",
                                             json_schema_extra=_SPEC)

    @field_validator("spec_type", mode="before")
    @classmethod
    def _parse_types(cls, v):
        if isinstance(v, str):
            v = v.split(",")
        names = tuple(dict.fromkeys(str(t).strip() for t in v if str(t).strip()))
        unknown = [n for n in names if n not in SPEC_TYPE_NAMES]
        if unknown:
            raise ValueError(f"unknown --spec-type {', '.join(unknown)}: one or more of {', '.join(SPEC_TYPE_NAMES)}")
        refused = [n for n in names if n in HIDDEN_STATE_TYPES]
        if refused:
            raise ValueError(f"--spec-type {', '.join(refused)}: {HIDDEN_STATE_REASON}")
        if "none" in names and len(names) > 1:
            raise ValueError("--spec-type none drafts nothing: give it alone")
        return names or ("none",)

    @field_validator("spec_draft_model")
    @classmethod
    def _model_exists(cls, v: Path | None):
        if v is not None and not v.is_file():
            raise ValueError(f"file not found: {v}")
        return v

    @model_validator(mode="after")
    def _spec_consistent(self):
        config = self.spec_config
        if config.needs_model and self.spec_draft_model is None:
            wanted = ", ".join(t for t in config.resolved_types if t in MODEL_TYPES)
            raise ValueError(f"--spec-type {wanted} needs a draft model: --spec-draft-model FILE")
        if self.spec_draft_model is not None and not config.needs_model:
            raise ValueError("--spec-draft-model is given but --spec-type uses no draft model: add draft-simple")
        for lo, hi, what in ((self.spec_draft_n_min, self.spec_draft_n_max, "--spec-draft"),
                             (self.spec_ngram_mod_n_min, self.spec_ngram_mod_n_max, "--spec-ngram-mod")):
            if lo is not None and hi is not None and lo > hi:
                raise ValueError(f"{what}-n-min ({lo}) is above {what}-n-max ({hi})")
        return self

    @property
    def spec_config(self) -> SpecConfig:
        def parts(*names: str) -> tuple[int | None, ...]:
            return tuple(getattr(self, name) for name in names)

        return SpecConfig(
            types=self.spec_type, adaptive=self.spec_policy == "adaptive",
            draft_n_max=self.spec_draft_n_max, draft_n_min=self.spec_draft_n_min, draft_p_min=self.spec_draft_p_min,
            ngram_simple=parts("spec_ngram_simple_size_n", "spec_ngram_simple_size_m", "spec_ngram_simple_min_hits"),
            ngram_map_k=parts("spec_ngram_map_k_size_n", "spec_ngram_map_k_size_m", "spec_ngram_map_k_min_hits"),
            ngram_map_k4v=parts("spec_ngram_map_k4v_size_n", "spec_ngram_map_k4v_size_m",
                                "spec_ngram_map_k4v_min_hits"),
            ngram_mod=parts("spec_ngram_mod_n_match", "spec_ngram_mod_n_min", "spec_ngram_mod_n_max"),
            draft_model=self.spec_draft_model, draft_gpu_layers=self.spec_draft_ngl,
            draft_threads=self.spec_draft_threads,
        )
