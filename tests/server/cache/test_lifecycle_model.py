"""Seed 003's lifecycle model (issue 58, item 2): counts, the posterior transition probabilities,
the value of a waiting session, forks, priors files, and the predictive eviction order."""

from __future__ import annotations

import json

import pytest

from server.cache.eviction import LRUPolicy
from server.cache.eviction_queue import EvictionQueue
from server.cache.lifecycle import CacheHint, SessionRegistry
from server.cache.lifecycle_counts import N_BINS, Counts, Dwell
from server.cache.lifecycle_model import (
    COLLAB_WAIT,
    DONE,
    MODEL_CALL,
    STATES,
    TOOL_WAIT,
    LifecycleModel,
    ModelParams,
)
from server.cache.lifecycle_priors import PriorsError, load_priors, save_priors
from server.cache.predictive_policy import PredictivePolicy, Tips
from tests.server.cache.sim_payload import simulated_tree
from tests.server.cache.tree_helpers import freed_nodes


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def cycle(model: LifecycleModel, session: str, start: float, wait: float, state: str = "tool_wait") -> float:
    """One call of `session` at `start` lasting 0.1 s, then a wait of `wait` seconds; the next start."""
    model.arrived(session, now=start)
    model.ended(session, state, now=start + 0.1)
    return start + 0.1 + wait


def test_posterior_transitions_are_alpha_plus_offline_plus_online_counts():
    prior = Counts()
    prior.transitions[TOOL_WAIT][MODEL_CALL] = 6.0
    prior.transitions[TOOL_WAIT][DONE] = 2.0
    model = LifecycleModel(ModelParams(alpha=0.5), prior, clock=Clock())
    t = 0.0
    for _ in range(3):
        t = cycle(model, "s", t, 1.0)
    model.arrived("s", now=t)  # the third wait ends in a call
    # online: tool_wait -> model_call 3 times; row = 0.5 * 4 + (6 + 2) + 3
    assert model.transition_p(TOOL_WAIT, MODEL_CALL) == pytest.approx((0.5 + 6 + 3) / (4 * 0.5 + 8 + 3))
    assert model.transition_p(TOOL_WAIT, DONE) == pytest.approx((0.5 + 2) / (4 * 0.5 + 8 + 3))
    assert sum(model.transition_p(TOOL_WAIT, j) for j in STATES) == pytest.approx(1.0)
    assert model.summary()["transitions_online"] == {MODEL_CALL: {TOOL_WAIT: 3}, TOOL_WAIT: {MODEL_CALL: 3}}


def test_a_session_about_to_return_outranks_one_that_just_left():
    clock = Clock()
    model = LifecycleModel(ModelParams(), clock=clock)
    t = 0.0
    for _ in range(12):  # the tool takes 3 s, every time
        t = cycle(model, "learner", t, 3.0)
    model.arrived("early", now=100.0)
    model.ended("early", "tool_wait", now=100.1)
    model.arrived("late", now=102.5)
    model.ended("late", "tool_wait", now=102.6)
    values = {s: model.session_value(s, now=103.0) for s in ("early", "late")}
    assert values["early"] > 10 * values["late"] > 0, values  # early is due at 103.1, late at 105.6
    # overdue counts as imminent (a little less sure it comes back at all) ...
    assert model.session_value("early", now=104.0) > 0.5 * values["early"]
    # ... until it has waited far longer than any return seen: then it fades
    assert model.session_value("early", now=400.0) < values["early"] / 10
    model.arrived("running", now=103.0)
    assert model.session_value("running", now=103.0) == 1.0


def test_a_state_that_never_came_back_is_worth_nothing():
    model = LifecycleModel(ModelParams(), clock=Clock())
    t = 0.0
    for i in range(6):
        t = cycle(model, f"s{i}", t, 0.5, state="done")
    assert model.session_value("s0", now=t) == 0.0
    assert model.return_p(DONE) < model.return_p(TOOL_WAIT), "the hints' prior: a finished session stays done"


def test_a_fork_counts_one_return_of_the_parents_wait():
    clock = Clock()
    model = LifecycleModel(ModelParams(), clock=clock)
    policy = PredictivePolicy(model)
    trunk = list(range(100))
    clock.now = 0.0
    policy.arrived("s/main", trunk)
    clock.now = 1.0
    policy.ended("s/main", "active", trunk)
    assert model.state("s/main") == COLLAB_WAIT
    branch = trunk[:-Tips.TAIL + 2] + [500, 501, 502]  # the trunk less its generation prompt, then more
    clock.now = 3.0
    policy.arrived("s/b0", branch + [7])
    policy.arrived("s/b1", branch + [8])  # the second branch of the same fork point: no second return
    policy.arrived("t/main", [1000, 1001] + trunk)  # shares nothing at the start: no fork
    assert model.forks == 2
    assert model.summary()["transitions_online"][COLLAB_WAIT] == {MODEL_CALL: 1}
    assert model.state("s/main") == COLLAB_WAIT, "the parent waits on: another branch may come"


def test_quiet_sessions_leave_for_done_then_for_good():
    model = LifecycleModel(ModelParams(quiet_s=10.0), clock=Clock())
    cycle(model, "s", 0.0, 0.0)
    model.arrived("other", now=11.0)  # any event sweeps
    assert model.state("s") == DONE and model.quiet == 1
    model.arrived("other2", now=30.0)
    assert model.state("s") is None, "a finished session quiet again is forgotten"


def test_dwell_histograms_survival_and_kernel():
    d = Dwell()
    for _ in range(10):
        d.add(2.0)
    assert d.total == pytest.approx(10.0)
    assert d.survival(0.01) == pytest.approx(1.0)
    assert d.survival(1000.0) == pytest.approx(0.0)
    assert 0.2 < d.survival(2.0) < 0.8
    with pytest.raises(ValueError):
        Dwell([1.0] * (N_BINS - 1))


def test_priors_round_trip_and_refusals(tmp_path):
    model = LifecycleModel(ModelParams(), clock=Clock())
    t = 0.0
    for _ in range(5):
        t = cycle(model, "s", t, 2.0)
    model.finish(t)
    path = tmp_path / "priors.json"
    save_priors(model.online, path, sources=["test"], sessions=1)
    counts = load_priors(path)
    assert counts.transitions == model.online.transitions
    assert counts.returns[TOOL_WAIT].counts == pytest.approx(model.online.returns[TOOL_WAIT].counts)
    loaded = LifecycleModel(ModelParams(), counts, clock=Clock())
    assert loaded.return_p(TOOL_WAIT) == pytest.approx(model.return_p(TOOL_WAIT), rel=0.2)
    data = json.loads(path.read_text())
    for broken, why in ((dict(data, format="x"), "not a lifecycle priors"),
                        (dict(data, bins={"min_s": 1, "ratio": 2, "n": 3}), "dwell bins"),
                        (dict(data, transitions={"tool_wait": {"nowhere": 1}}), "bad transition")):
        path.write_text(json.dumps(broken))
        with pytest.raises(PriorsError, match=why):
            load_priors(path)


def _tagged_tree():
    """Three sessions' paths; `soon` will call again soon, `later` in a while, `gone` never."""
    clock = Clock()
    model = LifecycleModel(ModelParams(), clock=clock)
    t = 0.0
    for _ in range(8):  # tool waits of 2 s
        t = cycle(model, "learner", t, 2.0)
    tree, insert = simulated_tree(bytes_per_token=1)
    registry = SessionRegistry()
    nodes = {}
    for name, ended, state in (("soon", 50.0, "tool_wait"), ("gone", 51.0, "done"), ("later", 51.5, "tool_wait")):
        nodes[name] = tip = insert([hash(name) % 1000, 1, 2, 3]).last_node
        model.arrived(name, now=ended - 0.1)
        model.ended(name, state, now=ended)
        registry.observe(CacheHint(name, state), tip)  # type: ignore[arg-type]
    tree.match_prefix([hash("later") % 1000, 1, 2, 3])  # LRU now keeps `later` longest
    clock.now = 51.6
    return tree, nodes, PredictivePolicy(model, registry)


def test_predictive_order_is_by_value_where_lru_is_by_recency():
    tree, nodes, policy = _tagged_tree()
    assert policy.priority(nodes["gone"])[0] == 0.0  # a finished session is not timed by the tool waits' returns
    assert freed_nodes(tree.flush("H", policy)) == (nodes["gone"], nodes["later"], nodes["soon"])
    tree, nodes, _ = _tagged_tree()
    assert freed_nodes(tree.flush("H", LRUPolicy())) == (nodes["soon"], nodes["gone"], nodes["later"])


def test_pinned_sessions_are_never_taken():
    tree, nodes, policy = _tagged_tree()
    assert policy.registry is not None
    policy.registry.observe(CacheHint("gone", pin=True), nodes["gone"])
    assert nodes["gone"] not in freed_nodes(tree.flush("H", policy))


def test_the_queue_ranks_again_when_the_policys_epoch_moves():
    tree, insert = simulated_tree(bytes_per_token=1)
    a, b, c = (insert([k, k]).last_node for k in (1, 2, 3))
    rank = {a.id: 1.0, b.id: 2.0, c.id: 3.0}

    class Policy:
        epoch = 0

        def priority(self, node):
            return (rank[node.id],)

    def first_two(queue):
        candidates = queue.pop_candidates(lambda n: True)
        return next(candidates), next(candidates)

    policy = Policy()
    rank[c.id] = 1.5  # c's value fell below b's: its old key in the heap is too large
    assert first_two(EvictionQueue(policy, policy.priority, [a, b, c])) == (a, c)  # (a fresh queue)
    rank[c.id] = 3.0
    queue = EvictionQueue(policy, policy.priority, [a, b, c])
    rank[c.id] = 1.5
    assert first_two(queue) == (a, b), "without an epoch the lazy check misses a key that fell"
    rank[c.id] = 3.0
    queue = EvictionQueue(policy, policy.priority, [a, b, c])
    rank[c.id] = 1.5
    policy.epoch = 1  # the policy says its keys moved: the queue ranks every node again
    assert first_two(queue) == (a, c)


def test_a_tool_wait_is_timed_by_its_tools_returns_once_the_tool_has_shown_enough():
    """Two tools, one quick (0.5 s) and one slow (4 s): the state's returns mix them, so a session waiting on the
    quick tool looks half as likely to be back soon as it is. Named in the hint, each tool's own returns time it:
    the quick tool's session is due at once, the slow tool's later; without the tool the state's mix is used."""
    model = LifecycleModel(ModelParams(), clock=Clock())
    t = 0.0
    for i in range(8):
        for tool, wait in (("grep", 0.5), ("build", 4.0)):
            model.arrived(f"{tool}{i}", now=t)
            model.ended(f"{tool}{i}", "tool_wait", now=t + 0.1, tool=tool)
            model.arrived(f"{tool}{i}", now=t + 0.1 + wait)
            t += 10.0
    assert model.summary()["tools_timed"] == 2
    for name, tool in (("quick", "grep"), ("slow", "build"), ("unnamed", None), ("unseen", "deploy")):
        model.arrived(name, now=200.0)
        model.ended(name, "tool_wait", now=200.1, tool=tool)
    v = {name: model.session_value(name, now=200.3) for name in ("quick", "slow", "unnamed", "unseen")}
    assert v["quick"] > 1.5 * v["unnamed"] > 0, v
    assert v["slow"] < v["unnamed"] / 2, v
    assert v["unseen"] == v["unnamed"], "a tool with too few returns is timed by the state's returns"
    # a bare hint may name the tool of a wait already begun: the wait's start stays, its timing follows the tool
    model.hinted("unnamed", "tool_wait", now=200.2, tool="grep")
    assert model.session_value("unnamed", now=200.3) == v["quick"]
    # the tool goes with the wait: the next tool wait, named by no hint, is timed by the state's returns again
    for name in ("quick", "plain"):
        model.arrived(name, now=201.0)
        model.ended(name, "tool_wait", now=201.1)
    assert model.session_value("quick", now=201.3) == model.session_value("plain", now=201.3) < v["quick"]


def test_tools_kept_are_bounded_least_recently_returned_first(monkeypatch):
    """Tool names come from clients: the model keeps the return times of at most MAX_TOOLS of them."""
    import server.cache.lifecycle_model as lm

    monkeypatch.setattr(lm, "MAX_TOOLS", 3)
    model = LifecycleModel(ModelParams(), clock=Clock())
    for i, tool in enumerate(["a", "b", "c", "a", "d"]):
        model.arrived("s", now=10.0 * i)
        model.ended("s", "tool_wait", now=10.0 * i + 0.1, tool=tool)
        model.arrived("s", now=10.0 * i + 1.0)
        model.ended("s", "done", now=10.0 * i + 1.1)
    assert list(model.tool_returns) == ["c", "a", "d"], "b returned least recently: dropped first"
    assert model.tool_returns["a"].total == 2


def test_a_kind_of_wait_not_seen_to_end_yet_is_timed_by_every_waits_returns():
    """A fork point (`active`) before its first branches: its state has shown no return yet, so it is expected back
    like the waits seen so far (the tool and collaboration waits' returns pooled), not worth 0 beside timed tool
    waits (its KV went first, and its branches recomputed the trunk's last turn: issue 58). With no return seen at
    all, nothing is timed; a finished session is not timed by the others' returns."""
    model = LifecycleModel(ModelParams(), clock=Clock())
    model.arrived("trunk", now=0.0)
    model.ended("trunk", "active", now=0.1)
    assert model.session_value("trunk", now=1.0) == 0.0
    t = 1.0
    for _ in range(8):  # tools that take 2 s: the only returns seen
        t = cycle(model, "tools", t, 2.0)
    model.arrived("tools", now=t)
    model.ended("tools", "tool_wait", now=t + 0.1)
    model.arrived("trunk", now=t)
    model.ended("trunk", "active", now=t + 0.1)
    now = t + 2.0  # both due in about 0.1 s
    trunk, tools = model.session_value("trunk", now=now), model.session_value("tools", now=now)
    assert model.online.returns[COLLAB_WAIT].total == 1  # (fewer returns than MIN_RETURNS: not timed by its own)
    assert tools > 0 and trunk > 0.3 * tools, (trunk, tools)  # less sure to come back (the hints' prior), as soon
    model.arrived("finished", now=t)
    model.ended("finished", "done", now=t + 0.1)
    assert model.session_value("finished", now=now) == 0.0
