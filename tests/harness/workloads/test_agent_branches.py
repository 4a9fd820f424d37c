"""Agent sessions that fork into branches (issue 58's workload) and the replay's hints for them."""

from harness.manifest import dumps_manifest
from harness.serving.ordering import predecessors
from harness.serving.runner import hint_states, hint_tools
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
    # each tool wait names the tool whose result the next request brings back (the server times it by that tool)
    tools = hint_tools(lines)
    for index, state in enumerate(hint_states(lines)):
        if state != "tool_wait":
            continue
        nxt = next(i for i in range(index + 1, len(lines)) if lines[i].cache_session == lines[index].cache_session)
        called = lines[nxt].body["messages"][-2]["tool_calls"][0]["function"]["name"]
        assert tools[index] == called, (index, tools)


def test_tool_waits_follow_each_tool_call_and_leave_the_texts_alone():
    plain = agent_sessions(sessions=4, turns=4, branches=2, fork_after=2)
    waited = agent_sessions(sessions=4, turns=4, branches=2, fork_after=2, tool_wait_s=(0.2, 3.0))
    assert [line.body for line in waited.lines] == [line.body for line in plain.lines]
    firsts = {(line.session_id, "main") for line in waited.lines}
    for line in waited.lines:
        if line.branch_id == "main" and (line.session_id, "main") in firsts:
            firsts.discard((line.session_id, "main"))
            assert line.after_s is None, "a session's first request follows no tool"
        else:
            assert 0.2 <= line.after_s <= 3.0
    assert len({line.after_s for line in waited.lines}) > 8, "the waits vary"
    again = agent_sessions(sessions=4, turns=4, branches=2, fork_after=2, tool_wait_s=(0.2, 3.0))
    assert [line.after_s for line in again.lines] == [line.after_s for line in waited.lines]
    text = dumps_manifest(waited.lines)
    assert '"after_s"' in text and '"after_s"' not in dumps_manifest(plain.lines)


def test_a_waiting_line_reads_back_as_written():
    from harness.manifest import parse_manifest

    lines = agent_sessions(sessions=2, turns=3, tool_wait_s=(0.5, 1.0)).lines
    back = list(parse_manifest(dumps_manifest(lines)))
    assert [line.after_s for line in back] == [line.after_s for line in lines]
