"""Planted-fault controls of the cache-on / cache-off comparison (issue 60, item 2).

On the embedded model (Q4_1 weights, activations quantized per block) two chunkings of one prompt
move log-probabilities by up to ~0.6 nats, cache or no cache, and a cache error of one position or
one cell moves them by about as much: there the near-tie rule flags a stale cell now and then and a
restored segment shifted by one position almost never (docs/benchmark-notes.md, "Near-tie
partings"). So the comparison is also run on a float32 model of random weights (two layers, the
embedded tokenizer, weights at scale WEIGHT_SCALE so that attention depends on positions), with the
router's defaults (paged attention, owned pages, tiers A, S, H and D) and drafting off, and checked
teacher-forced: the log-probabilities of the tokens both runs rank, at every position both read the
same tokens before (engine_harness.logprob_drift), must agree within DRIFT_BOUND, and every parting
must be a near-tie. The same check passes the real cache and flags each planted fault
(tests/server/cache/planted_faults.py) in every run, on every request served from H or D.

DRIFT_BOUND: the real cache drifts by at most 9.8e-3 here (400 pairs, test_parting_rate.py), a segment
shifted by one position by at least 7.9e-2 and a stale cell by at least 0.25 on the requests they touch
(200 pairs each; docs/benchmark-notes.md, "Near-tie partings").
"""

from __future__ import annotations

import pytest

from tests.server.cache.engine_harness import Comparison, comparison_summary
from tests.server.cache.planted_faults import extract_prefix, shift_by_one, stale_cell
from tests.server.cache.test_router_real import compare_cache_on_off, comparison_prompts, load

pytestmark = pytest.mark.model

WEIGHT_SCALE = 0.08  # synth_model's is 0.02: attention then barely depends on where a key is
DRIFT_BOUND = 3e-2
TOP_K = 1000  # log-probabilities compared per position (of 49152)
PAIRS = 50
FAULTS = ["shift_by_one", "stale_cell"]
DONOR = ("<|im_start|>system\nYou read out lists: the numbers from one to two hundred in words, the capitals "
         "of Europe, the planets, the colours of the rainbow, the days of the week and the months of the year, "
         "one item per line, slowly.<|im_end|>\n<|im_start|>user\nStart with the numbers and go on until every "
         "list is done, then read them all again backwards, and after that count down from two hundred to one in "
         "words, one number per line, without skipping any.<|im_end|>\n")


@pytest.fixture(scope="module")
def f32_model(tmp_path_factory):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (run scripts/setup.sh)")
    from harness.models import synth_model

    shape = synth_model.ModelShape("llama", n_layer=2, n_embd=128, n_head=4, n_head_kv=2, n_ff=256, head_dim=32,
                                   context_length=4096)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(synth_model, "WEIGHT_SCALE", WEIGHT_SCALE)
        return synth_model.write_model(shape, "f32", tmp_path_factory.mktemp("faults") / "llama-f32.gguf", seed=5)


@pytest.fixture(scope="module")
def f32_reference(f32_model):
    model = load(None, model=f32_model, no_cache=True, parallel=2, spec_type="none")
    yield model
    model.close()


def drift_problems(rows: list[Comparison]) -> list[str]:
    """The float32 model's check of a cache-on / cache-off run."""
    problems = [r.problem for r in rows if r.problem]
    problems += [f"answer {i} (from {r.source}) drifts by {r.drift:.3g} > {DRIFT_BOUND}"
                 for i, r in enumerate(rows) if r.drift > DRIFT_BOUND]
    return problems


def run(f32_model, f32_reference, tmp_path, fault: str | None, pairs: int = PAIRS) -> tuple[list[Comparison], int]:
    """The comparison over `pairs` prompts with `fault` planted; (rows, restores it spoiled)."""
    model = load(tmp_path, model=f32_model, parallel=2, spec_type="none")
    try:
        planted = None
        if fault == "shift_by_one":
            planted = shift_by_one(model)
        elif fault == "stale_cell":
            donor = extract_prefix(model, model.runtime.tokenize(DONOR, add_special=False, parse_special=True))
            planted = stale_cell(model, donor)
        rows = compare_cache_on_off(model, f32_reference, comparison_prompts(model, pairs), top_k=TOP_K)
        return rows, planted.spoiled if planted else 0
    finally:
        model.close()


def test_the_real_cache_passes_the_teacher_forced_check(f32_model, f32_reference, tmp_path):
    rows, _ = run(f32_model, f32_reference, tmp_path, None)
    print(f"real cache: {comparison_summary(rows)}")
    assert sum(r.source in ("H", "D") for r in rows) >= 10, [r.source for r in rows]
    problems = drift_problems(rows)
    assert not problems, problems


@pytest.mark.parametrize("fault", FAULTS)
def test_each_planted_fault_is_flagged_on_every_request_it_touches(f32_model, f32_reference, tmp_path, fault):
    rows, spoiled = run(f32_model, f32_reference, tmp_path, fault)
    restored = [r for r in rows if r.source in ("H", "D")]
    flagged = [r for r in restored if r.drift > DRIFT_BOUND or r.problem]
    by_rule = sum(r.problem is not None for r in rows)
    print(f"{fault}: {comparison_summary(rows)}; {spoiled} restores spoiled, {len(flagged)}/{len(restored)} "
          f"answers from H or D flagged, {by_rule} by the near-tie rule alone")
    assert spoiled >= 10 and len(restored) >= 10, (spoiled, [r.source for r in rows])
    assert drift_problems(rows), "the planted fault passed the check"
    assert len(flagged) == len(restored), [(r.source, r.drift) for r in restored]
