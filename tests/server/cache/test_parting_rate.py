"""The bounds of the cache-on / cache-off comparisons, and the measurement they come from.

tests/server/near_tie.py bounds how often a cache-on answer parts from the cache-off one on the
embedded model (PARTING_RATE, FIRST_TOKEN_PARTING_RATE); tests/server/cache/test_cache_faults_real.py
bounds the teacher-forced drift on its float32 model (DRIFT_BOUND). docs/benchmark-notes.md,
"Near-tie partings", records what was measured and the bounds; the first test checks that the
bounds the tests use are the ones recorded there (no model, always run).

The measurement runs only when asked (it takes minutes), with the number of pairs:

    ARBOR_PARTING_PAIRS=400 .venv/bin/python -m pytest tests/server/cache/test_parting_rate.py -q -n 0 -s

It runs test_router_real.py's comparison (50 prompts per fresh cache-on engine, the defaults'
paged attention and owned pages, drafting off) over PAIRS // 50 seeds on the embedded model and
prints the parting rate, the first-token parting rate and the gaps; then the float32 model's
comparison over as many pairs and its largest drift; then, for the record, one run of each planted
fault on the embedded model (what the near-tie rule and the rate bound catch there). It fails when
a measured rate or drift is above the bound the tests use.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.server.cache import test_cache_faults_real as faults
from tests.server.near_tie import FIRST_TOKEN_PARTING_RATE, NEAR_TIE_NATS, PARTING_RATE, parting_bound

ROOT = Path(__file__).resolve().parents[3]
PAIRS = int(os.environ.get("ARBOR_PARTING_PAIRS", "0") or 0)


def _section() -> str:
    text = (ROOT / "docs" / "benchmark-notes.md").read_text()
    start = text.index("## Near-tie partings")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def test_the_bounds_the_tests_use_are_the_ones_recorded():
    section = _section()
    for name, value in (("PARTING_RATE", PARTING_RATE), ("FIRST_TOKEN_PARTING_RATE", FIRST_TOKEN_PARTING_RATE),
                        ("DRIFT_BOUND", faults.DRIFT_BOUND), ("NEAR_TIE_NATS", NEAR_TIE_NATS)):
        recorded = re.search(rf"`{name} = ([0-9.e+-]+)`", section)
        assert recorded and float(recorded.group(1)) == value, f"docs/benchmark-notes.md: {name} = {value}?"
    assert f"at most {parting_bound(50)} of 50" in section
    assert f"at most {parting_bound(50, FIRST_TOKEN_PARTING_RATE)} of 50 at their first token" in section
    assert "ARBOR_PARTING_PAIRS=" in section  # the command that measures them


if PAIRS:
    from tests.server.cache.test_cache_faults_real import f32_model, f32_reference  # noqa: F401 (fixtures)

    pytestmark = pytest.mark.model

    def test_measure_the_parting_rate_and_the_drift(tmp_path, f32_model, f32_reference):  # noqa: F811
        from tests.server.cache.planted_faults import extract_prefix, shift_by_one, stale_cell
        from tests.server.cache.test_router_real import compare_cache_on_off, comparison_prompts, load

        blocks = max(1, PAIRS // 50)
        reference = load(None, no_cache=True, parallel=2, spec_type="none")
        try:
            rows = []
            for b in range(blocks):
                model = load(tmp_path / f"block{b}", parallel=2, spec_type="none")
                try:
                    rows += compare_cache_on_off(model, reference, comparison_prompts(model, seed=7 + b))
                finally:
                    model.close()
            fault_rows = {}
            for name in ("shift_by_one", "stale_cell"):
                model = load(tmp_path / name, parallel=2, spec_type="none")
                try:
                    if name == "shift_by_one":
                        shift_by_one(model)
                    else:
                        stale_cell(model, extract_prefix(model, model.runtime.tokenize(
                            faults.DONOR, add_special=False, parse_special=True)))
                    fault_rows[name] = compare_cache_on_off(model, reference, comparison_prompts(model))
                finally:
                    model.close()
        finally:
            reference.close()
        f32_rows = []
        for b in range(blocks):
            model = load(tmp_path / f"f32-{b}", model=f32_model, parallel=2, spec_type="none")
            try:
                f32_rows += compare_cache_on_off(model, f32_reference, comparison_prompts(model, seed=7 + b),
                                                 top_k=faults.TOP_K)
            finally:
                model.close()

        n = len(rows)
        parted = [r for r in rows if r.parting is not None]
        first = [r for r in parted if r.parting == 0]
        per_block = [sum(r.parting is not None for r in rows[i:i + 50]) for i in range(0, n, 50)]
        gaps = sorted(r.gap for r in parted)
        print(f"\nembedded model, {n} pairs in {blocks} runs of 50: {len(parted)} part ({len(parted) / n:.3f}), "
              f"{len(first)} at the first token ({len(first) / n:.3f}); per run {per_block}; gaps at the parting "
              f"{[round(g, 3) for g in gaps]}; near-tie problems {sum(r.problem is not None for r in rows)}; "
              f"largest teacher-forced drift {max(r.drift for r in rows):.3f}")
        for name, fr in fault_rows.items():
            fp = [r for r in fr if r.parting is not None]
            print(f"embedded model, {name}: {len(fp)}/50 part, {sum(r.parting == 0 for r in fp)} at the first "
                  f"token, {sum(r.problem is not None for r in fr)} flagged by the near-tie rule; largest drift "
                  f"{max(r.drift for r in fr):.3f}")
        drift = max(r.drift for r in f32_rows)
        print(f"float32 model, {len(f32_rows)} pairs: largest teacher-forced drift {drift:.3g} "
              f"(bound {faults.DRIFT_BOUND}); {sum(r.parting is not None for r in f32_rows)} part")
        assert not [r.problem for r in rows if r.problem]
        assert len(parted) / n <= PARTING_RATE and len(first) / n <= FIRST_TOKEN_PARTING_RATE
        assert drift <= faults.DRIFT_BOUND
