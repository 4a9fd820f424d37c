"""Generators: determinism, the intended sharing structure, and ideals checked by brute force."""

import json

import pytest

from harness.manifest import dumps_manifest
from harness.workloads import generators as gen
from harness.workloads.ideal import word_tokens
from harness.workloads.request_text import render_request_text


def prompts_of(workload):
    return [word_tokens(render_request_text(line.body)) for line in workload.lines]


def brute_force_ideal(prompts):
    total = 0
    for i, p in enumerate(prompts):
        best = max((next((k for k in range(min(len(p), len(q))) if p[k] != q[k]), min(len(p), len(q)))
                    for q in prompts[:i]), default=0)
        total += max(1, len(p) - best)
    return total


def distinct_prefixes(prompts):
    """Unique tokens of the workload: distinct token paths (the union bound's count)."""
    return len({tuple(p[:k]) for p in prompts for k in range(1, len(p) + 1)})


SMALL = {
    "shared-prefix": dict(groups=3, prompts_per_group=4, system_len=40, question_len=10),
    "agent-sessions": dict(sessions=3, turns=4, system_len=40, user_len=8, tool_result_len=15),
    "branch-fanout": dict(branches=4, trunk_len=60, branch_len=10, branch_turns=2, trunks=2),
    "unique": dict(count=6, prompt_len=20),
}


@pytest.mark.parametrize("kind", sorted(SMALL))
def test_ideal_matches_brute_force_and_unique_tokens(kind):
    workload = gen.GENERATORS[kind](**SMALL[kind])
    prompts = prompts_of(workload)
    assert workload.ideal.unit == "words"
    assert workload.ideal.ideal_computed_tokens == brute_force_ideal(prompts)
    # No prompt here is a prefix of an earlier one, so the ideal equals the count of unique tokens.
    assert workload.ideal.ideal_computed_tokens == distinct_prefixes(prompts)
    assert workload.ideal.total_prompt_tokens == sum(len(p) for p in prompts)


@pytest.mark.parametrize("kind", sorted(SMALL))
def test_deterministic_per_seed(kind):
    a = dumps_manifest(gen.GENERATORS[kind](**SMALL[kind], seed=7).lines)
    b = dumps_manifest(gen.GENERATORS[kind](**SMALL[kind], seed=7).lines)
    c = dumps_manifest(gen.GENERATORS[kind](**SMALL[kind], seed=8).lines)
    assert a == b and a != c


def test_shared_prefix_groups_share_only_their_system_prompt():
    workload = gen.shared_prefix_groups(groups=3, prompts_per_group=4, system_len=50, question_len=12,
                                        order="grouped")
    systems = {}
    questions = set()
    for line in workload.lines:
        system, user = line.body["messages"]
        group = line.session_id.split("-")[0]
        systems.setdefault(group, set()).add(system["content"])
        questions.add(user["content"])
    assert all(len(s) == 1 for s in systems.values()) and len({next(iter(s)) for s in systems.values()}) == 3
    assert len(questions) == 12
    assert all(abs(len(next(iter(s)).split()) - 50) <= 1 for s in systems.values())
    # each group's system prompt is computed by its first prompt only; later prompts reuse all of it
    seen = set()
    for line, shared in zip(workload.lines, workload.ideal.shared_prefix):
        system_pieces = len(word_tokens(render_request_text({"messages": line.body["messages"][:1]})))
        group = line.session_id.split("-")[0]
        if group in seen:
            assert shared >= system_pieces
        else:
            assert shared < system_pieces // 2
        seen.add(group)


def test_shared_prefix_orders():
    def ids(order):
        return [ln.session_id for ln in gen.shared_prefix_groups(
            groups=2, prompts_per_group=2, system_len=5, question_len=5, order=order).lines]

    assert ids("grouped") == ["group0-prompt0", "group0-prompt1", "group1-prompt0", "group1-prompt1"]
    assert ids("interleaved") == ["group0-prompt0", "group1-prompt0", "group0-prompt1", "group1-prompt1"]
    assert sorted(ids("shuffled")) == sorted(ids("grouped"))
    with pytest.raises(ValueError, match="order"):
        gen.shared_prefix_groups(order="random")


def test_agent_sessions_grow_history_with_tool_results():
    workload = gen.agent_sessions(scenario="field_maintenance", sessions=2, turns=3, system_len=30,
                                  user_len=6, tool_result_len=10, session_interval_s=1.5, think_time_s=0.5)
    by_session = {}
    for line in workload.lines:
        by_session.setdefault(line.session_id, []).append(line)
    assert [ln.t for ln in workload.lines] == sorted(ln.t for ln in workload.lines)
    system = {lines[0].body["messages"][0]["content"] for lines in by_session.values()}
    assert len(system) == 1  # one agent prompt for the scenario
    for s, lines in enumerate(by_session.values()):
        assert [ln.t for ln in lines] == [1.5 * s, 1.5 * s + 0.5, 1.5 * s + 1.0]
        for earlier, later in zip(lines, lines[1:]):
            m0, m1 = earlier.body["messages"], later.body["messages"]
            assert m1[: len(m0)] == m0 and len(m1) == len(m0) + 2
            call, result = m1[-2], m1[-1]
            assert call["tool_calls"][0]["id"] == result["tool_call_id"]
            assert call["tool_calls"][0]["function"]["name"] in {t["function"]["name"] for t in later.body["tools"]}
            json.loads(call["tool_calls"][0]["function"]["arguments"])
        assert lines[-1].expected_output_tokens == 48 and lines[0].expected_output_tokens == 12
    with pytest.raises(ValueError, match="scenario"):
        gen.agent_sessions(scenario="nope")


def test_branch_fanout_forks_from_trunk():
    workload = gen.branch_fanout(branches=3, trunk_len=40, branch_len=8, branch_turns=2)
    trunk = [ln for ln in workload.lines if ln.branch_id == gen.TRUNK_BRANCH]
    branches = [ln for ln in workload.lines if ln.branch_id != gen.TRUNK_BRANCH]
    assert len(trunk) == 1 and len(branches) == 6 and workload.lines[0] is trunk[0]
    trunk_messages = trunk[0].body["messages"]
    firsts = {}
    for line in branches:
        messages = line.body["messages"]
        assert messages[: len(trunk_messages)] == trunk_messages
        firsts.setdefault(line.branch_id, messages[len(trunk_messages) + 1]["content"])
    assert len(set(firsts.values())) == 3  # each branch asks its own question


def test_unique_prompts_share_nothing_but_the_role_tag():
    workload = gen.unique_prompts(count=5, prompt_len=12)
    prompts = prompts_of(workload)
    assert workload.ideal.ideal_computed_tokens == sum(len(p) for p in prompts) - 4 * 1  # "<|user|>\n" piece


def test_body_tokenizer_gives_token_unit():
    workload = gen.unique_prompts(count=3, prompt_len=5, tokenize=lambda body: [ord(c) for c in json.dumps(body)])
    assert workload.ideal.unit == "tokens"


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="groups"):
        gen.shared_prefix_groups(groups=0)
    with pytest.raises(ValueError, match="interval_s"):
        gen.unique_prompts(interval_s=-1)
