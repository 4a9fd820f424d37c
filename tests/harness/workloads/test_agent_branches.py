"""Agent sessions that fork into branches (issue 58's workload) and the replay's hints for them."""

from harness.manifest import dumps_manifest
from harness.serving.ordering import predecessors
from harness.serving.runner import hint_states
from harness.workloads.generators import agent_sessions


def test_sixteen_sessions_of_four_turns_forking_into_two_branches_send_96_requests():
    work = agent_sessions(sessions=16, turns=4, branches=2, fork_after=2)
    assert len(work.lines) == 96
    per_session = [line for line in work.lines if line.session_id == "edge_incident-3"]
    assert [line.branch_id for line in per_session] == ["main", "main", "b0", "b0", "b1", "b1"]
    assert work.describe()["params"]["branches"] == 2


def test_branches_continue_the_trunk_with_calls_of_their_own():
    work = agent_sessions(sessions=1, turns=4, branches=2, fork_after=2)
    trunk, *_ = [line.body["messages"] for line in work.lines if line.branch_id == "main"][-1:]
    b0 = [line.body["messages"] for line in work.lines if line.branch_id == "b0"]
    b1 = [line.body["messages"] for line in work.lines if line.branch_id == "b1"]
    for branch in (b0, b1):
        assert branch[0][:len(trunk)] == trunk  # each branch starts from the trunk's last prompt
        assert branch[1][:len(branch[0])] == branch[0]
        assert branch[0][len(trunk)]["role"] == "assistant" and branch[0][len(trunk) + 1]["role"] == "tool"
    assert b0[0][len(trunk)] != b1[0][len(trunk)], "the branches call differently where they fork"
    assert b0[-1][-1]["role"] == "tool" and work.lines[-1].expected_output_tokens == 48


def test_one_branch_is_the_plain_workload_it_always_was():
    plain = agent_sessions(sessions=3, turns=4, seed=5)
    assert dumps_manifest(agent_sessions(sessions=3, turns=4, branches=1, seed=5).lines) == dumps_manifest(plain.lines)
    assert "branches" not in plain.describe()["params"]


def test_the_fork_point_says_active_and_the_branches_wait_for_it():
    lines = agent_sessions(sessions=1, turns=4, branches=2, fork_after=2).lines
    waits = predecessors(lines)
    assert waits == [None, 0, 1, 2, 1, 4]  # b0's and b1's first lines wait for the trunk's last
    # the trunk's first request continues with a tool result; its last is where both branches go on;
    # each branch's first continues with a tool result, its last ends the turn
    assert hint_states(lines) == ["tool_wait", "active", "tool_wait", "done", "tool_wait", "done"]
