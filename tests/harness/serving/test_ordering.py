"""Which request waits for which: sessions in order, branches fork from the trunk."""

from harness.manifest import ManifestLine
from harness.serving.ordering import predecessors


def line(session, branch):
    return ManifestLine(t=0.0, session_id=session, branch_id=branch, body={"messages": []})


def test_sessions_run_in_order_and_independently():
    lines = [line("a", "main"), line("b", "main"), line("a", "main"), line("b", "main"), line("a", "main")]
    assert predecessors(lines) == [None, None, 0, 1, 2]


def test_branches_fork_from_the_trunk_and_then_chain():
    lines = [line("s", "trunk"), line("s", "trunk"), line("s", "b0"), line("s", "b1"),
             line("s", "b0"), line("s", "trunk"), line("s", "b2")]
    # b0 and b1 fork from trunk line 1; b0's second turn follows b0; b2 forks after trunk line 5
    assert predecessors(lines) == [None, 0, 1, 1, 2, 1, 5]
