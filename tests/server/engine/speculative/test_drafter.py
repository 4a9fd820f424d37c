"""libarbor-spec through the drafter (server/engine/speculative/drafter.py): llama.cpp's own type names and
errors, and its n-gram drafters drafting from a lane's history. No model is loaded (the n-gram drafters read
tokens only)."""

from __future__ import annotations

import pytest

from server.engine.speculative.config import SPEC_TYPE_NAMES, SpecConfig
from server.engine.speculative.drafter import Drafter, DrafterError, DraftRequest
from server.engine.speculative.library import all_types, default_params

pytest.importorskip("llama_cpp")

# a history that says 10 11 12 13 14 15 16 17 once: after 10 11 12 comes the rest
HISTORY = [5, 6, 10, 11, 12, 13, 14, 15, 16, 17, 7, 8, 9, 10, 11]


def test_the_type_names_are_llama_cpps_own():
    assert set(all_types()) == set(SPEC_TYPE_NAMES) - {"auto"}


def test_the_defaults_are_llama_cpps():
    d = default_params()
    assert (d.ngram_map_k_size_n, d.ngram_map_k_size_m, d.ngram_map_k_min_hits) == (12, 48, 1)
    assert (d.ngram_mod_n_match, d.ngram_mod_n_min, d.ngram_mod_n_max) == (24, 48, 64)


@pytest.mark.parametrize("types, message", [
    (("ngram-foo",), "unknown speculative type: ngram-foo"),
    (("draft-eagle3",), "draft-eagle3: drafts from the target's hidden states"),
    (("draft-simple",), "needs a draft model"),
])
def test_a_drafter_that_cannot_be_made_says_why(types, message):
    with pytest.raises(DrafterError, match=message):
        Drafter(SpecConfig(types=types), 2)


@pytest.mark.parametrize("kind", ["ngram-simple", "ngram-map-k", "ngram-map-k4v"])
def test_an_ngram_drafter_drafts_what_followed_the_same_tokens_before(kind):
    key = "ngram_simple" if kind == "ngram-simple" else kind.replace("-", "_")
    drafter = Drafter(SpecConfig(types=(kind,), **{key: (3, 5, 1)}), 2)
    try:
        drafter.begin(1, HISTORY)
        (draft,) = drafter.draft([DraftRequest(lane=1, id_last=12, pos0=len(HISTORY), n_max=5)])
        assert draft == [13, 14, 15, 16, 17][: len(draft)] and len(draft) >= 3
        (short,) = drafter.draft([DraftRequest(lane=1, id_last=12, pos0=len(HISTORY), n_max=2)])
        assert short == [13, 14]
        drafter.accept(1, 2)
    finally:
        drafter.close()


def test_lanes_keep_their_own_histories_and_draft_in_one_call():
    drafter = Drafter(SpecConfig(types=("ngram-map-k",), ngram_map_k=(3, 4, 1)), 2)
    try:
        drafter.begin(0, HISTORY)
        other = [9, 9, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2]
        drafter.begin(1, other)
        drafts = drafter.draft([DraftRequest(0, 12, len(HISTORY), 4), DraftRequest(1, 3, len(other), 4)])
        assert drafts[0] == [13, 14, 15, 16] and drafts[1] == [4, 5, 6, 7]
    finally:
        drafter.close()


def test_what_the_target_generated_is_pushed_and_drafted_from():
    """A lane is begun with the prompt; the tokens the target keeps are pushed, and a phrase the generation
    repeats is drafted from its own earlier words."""
    drafter = Drafter(SpecConfig(types=("ngram-map-k",), ngram_map_k=(3, 4, 1)), 1)
    try:
        prompt = [1, 2, 3, 4, 5]
        drafter.begin(0, prompt)
        generated = [6, 20, 21, 22, 23, 24, 25, 26, 27, 30, 31, 32, 33]
        drafter.push(0, generated[:4])
        drafter.push(0, generated[4:])
        drafter.push(0, [20, 21])
        (draft,) = drafter.draft([DraftRequest(0, 22, len(prompt) + len(generated) + 2, 4)])
        assert draft == [23, 24, 25, 26]
    finally:
        drafter.close()


def test_no_match_drafts_nothing():
    drafter = Drafter(SpecConfig(types=("ngram-map-k",), ngram_map_k=(3, 4, 1)), 1)
    try:
        drafter.begin(0, [1, 2, 3, 4, 5])
        assert drafter.draft([DraftRequest(0, 99, 5, 4)]) == [[]]
    finally:
        drafter.close()


def test_a_lane_out_of_range_is_an_error_not_a_crash():
    drafter = Drafter(SpecConfig(types=("ngram-map-k",)), 1)
    try:
        with pytest.raises(RuntimeError, match="lane 3 out of range"):
            drafter.draft([DraftRequest(3, 1, 0, 4)])
        with pytest.raises(RuntimeError, match="begin lane 2"):
            drafter.begin(2, [1])
    finally:
        drafter.close()
