"""The ideal (docs/replay.md, "Computed tokens and the ideal") against a brute-force definition."""

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.workloads.ideal import PrefixIndex, ideal_computed, word_tokens


def brute_force_ideal(prompts):
    """Straight from the definition: length minus the longest prefix shared with any earlier prompt, min 1."""
    total = []
    for i, p in enumerate(prompts):
        best = 0
        for q in prompts[:i]:
            k = 0
            while k < min(len(p), len(q)) and p[k] == q[k]:
                k += 1
            best = max(best, k)
        total.append(max(1, len(p) - best) if p else 0)
    return total


prompt_lists = st.lists(st.lists(st.integers(0, 3), max_size=12), max_size=25)


@settings(max_examples=300, deadline=None)
@given(prompt_lists)
def test_matches_brute_force(prompts):
    result = ideal_computed(prompts)
    assert result.computed == brute_force_ideal(prompts)
    assert result.prompt_tokens == [len(p) for p in prompts]


def test_hand_examples():
    result = ideal_computed([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 9], [1, 2, 3, 4, 5, 6], [7]])
    # identical prompt still computes one token; others compute what is new
    assert result.computed == [4, 1, 1, 2, 1]
    assert result.shared_prefix == [0, 4, 2, 4, 0]
    assert result.ideal_computed_tokens == 9
    assert result.total_prompt_tokens == 4 + 4 + 3 + 6 + 1
    assert result.to_dict()["ideal_fraction"] == 9 / 18


def test_longest_match_can_be_an_older_prompt():
    # the best match is not the most recent prompt: sorted neighbours must find it
    index = PrefixIndex()
    for p in ([5, 5, 5, 5], [1, 2], [5, 9], [3]):
        index.add(p)
    assert index.longest_shared_prefix([5, 5, 5, 7]) == 3
    assert index.longest_shared_prefix([4]) == 0


def test_word_tokens_round_trip_and_prefixes():
    text = "  hello world\n  again "
    assert "".join(word_tokens(text)) == text
    a, b = word_tokens("the system prompt. Question one"), word_tokens("the system prompt. Question two")
    assert a[:-1] == b[:-1] and a[-1] != b[-1]


def test_empty_workload():
    result = ideal_computed([])
    assert result.ideal_computed_tokens == 0 and result.ideal_fraction == 0.0
