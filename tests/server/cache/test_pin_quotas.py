"""Pin quotas (issue 35, item 6): pinned KV is never evicted, so the number of pinned sessions
and the KV bytes they pin are bounded; a pin past either bound releases the oldest pins first,
counted. Unit level: the session registry over a simulated tree, a host-tier budget showing the
released KV becomes evictable again, and the router's once-per-step check."""

from __future__ import annotations

from types import SimpleNamespace

from server.cache.budget import ByteBudget, enforce_budget
from server.cache.eviction import LifecyclePolicy
from server.cache.lifecycle import CacheHint, SessionRegistry
from server.cache.write_back_policy import WriteBackPolicy, stored_bytes
from tests.server.cache.sim_payload import simulated_tree

BPT = 2  # bytes per token of the simulated payloads


def pin(reg: SessionRegistry, session: str, tip=None) -> None:
    reg.observe(CacheHint(session, "active", True), tip)


def pinned(reg: SessionRegistry) -> set[str]:
    return {s for s in ("a", "b", "c", "d", "e") if reg.is_pinned(s)}


def test_a_pin_beyond_the_session_quota_releases_the_oldest_pin():
    reg = SessionRegistry(max_pinned=2)
    pin(reg, "a")
    pin(reg, "b")
    reg.observe(CacheHint("a", "tool_wait", None))  # a later hint does not make "a" a newer pin
    pin(reg, "c")
    assert pinned(reg) == {"b", "c"} and reg.pins_released == 1
    assert reg.status("a").known and reg.status("a").state == "tool_wait"  # only the pin went
    pin(reg, "b")  # already pinned: nothing changes
    assert pinned(reg) == {"b", "c"} and reg.pins_released == 1
    reg.observe(CacheHint("b", "done", None))  # a release frees a place: the next pin fits
    pin(reg, "d")
    assert pinned(reg) == {"c", "d"} and reg.pins_released == 1
    s = reg.summary()
    assert (s["pinned"], s["max_pinned"], s["pins_released"]) == (2, 2, 1) and reg.n_pinned == 2


def test_a_zero_quota_turns_pins_off_and_a_bare_hint_counts_the_same():
    reg = SessionRegistry(max_pinned=0)
    pin(reg, "a")
    assert not reg.is_pinned("a") and reg.pins_released == 1
    reg = SessionRegistry(max_pinned=1)
    assert reg.apply(CacheHint("a", None, True)).pinned
    assert reg.apply(CacheHint("b", None, True)).pinned  # POST /cache/hint is bounded too
    assert not reg.is_pinned("a") and reg.pins_released == 1


def test_pinned_bytes_over_the_quota_release_the_oldest_pins_until_they_fit():
    tree, insert = simulated_tree(bytes_per_token=BPT)
    reg = SessionRegistry(max_pinned_bytes=100 * BPT)
    trunk = list(range(40))  # shared by every session: stays pinned while any pin covers it
    paths = {s: trunk + [1000 * (i + 1) + t for t in range(30)] for i, s in enumerate("abc")}
    with tree.mutex:
        for s, p in paths.items():
            pin(reg, s, insert(p).last_node)
        before = reg.enforce_pinned_bytes(tree.nodes(), stored_bytes)
    # 40 + 3 x 30 tokens pinned = 260 bytes over 200: "a" (oldest) goes, its 30 tokens with it
    assert pinned(reg) == {"b", "c"} and reg.pins_released == 1
    assert before == reg.pinned_bytes == (40 + 2 * 30) * BPT
    with tree.mutex:
        pin(reg, "d", insert(trunk + list(range(5000, 5100))).last_node)  # 100 more tokens
        reg.enforce_pinned_bytes(tree.nodes(), stored_bytes)
    # 40 + 30 + 30 + 100 = 200 tokens = 400 bytes: b and c go; d alone (140 tokens) still exceeds
    # 100 tokens, so it goes too, oldest first, and nothing is pinned
    assert pinned(reg) == set() and reg.pins_released == 4 and reg.pinned_bytes == 0 and reg.n_pinned == 0
    assert reg.summary()["pinned_bytes"] == 0


def test_released_pins_let_the_budget_evict_again():
    """The point of the quota: once a pin is released, its KV is evictable, so other
    sessions' stores are no longer declined."""
    tree, insert = simulated_tree(bytes_per_token=BPT)
    reg = SessionRegistry(max_pinned=1)
    policy = LifecyclePolicy(reg)
    with tree.mutex:
        pin(reg, "a", insert(list(range(100))).last_node)
        assert not enforce_budget(tree, "H", ByteBudget(0), policy).satisfied  # pinned: nothing goes
        pin(reg, "b", insert(list(range(1000, 1010))).last_node)  # the quota releases "a"
        res = enforce_budget(tree, "H", ByteBudget(10 * BPT), policy)
    assert res.satisfied and res.freed_bytes == 100 * BPT  # a's KV went, b's (pinned) stayed


def test_the_router_checks_the_byte_quota_once_per_change(monkeypatch):
    tree, insert = simulated_tree(bytes_per_token=BPT)
    reg = SessionRegistry(max_pinned_bytes=50 * BPT)
    walks = []
    real = reg.enforce_pinned_bytes

    def counting(nodes, nbytes):
        walks.append(1)
        return real(nodes, nbytes)

    monkeypatch.setattr(reg, "enforce_pinned_bytes", counting)
    policy = SimpleNamespace(registry=reg, tree=tree, _pin_signature=None)
    step = lambda: WriteBackPolicy.enforce_pin_quota(policy)  # noqa: E731 - what background() runs each step
    with tree.mutex:
        pin(reg, "a", insert(list(range(40))).last_node)
    step()
    step()  # nothing changed: no walk
    assert len(walks) == 1 and reg.is_pinned("a") and reg.pinned_bytes == 40 * BPT
    with tree.mutex:  # the pinned session stores more KV: over the quota
        reg.observe(CacheHint("a", "active", None), insert(list(range(80))).last_node)
    step()
    assert len(walks) == 2 and not reg.is_pinned("a") and reg.pins_released == 1
    step()
    assert len(walks) == 2


def test_the_pinned_count_follows_every_way_a_pin_ends():
    now = [0.0]
    reg = SessionRegistry(max_pinned=2, idle_seconds=10, clock=lambda: now[0])
    pin(reg, "a")
    pin(reg, "b")
    pin(reg, "c")  # the quota releases "a"
    reg.observe(CacheHint("b", None, False))  # unpinned by a hint
    assert reg.n_pinned == 1 == reg.summary()["pinned"]
    now[0] = 100.0
    pin(reg, "d")  # "c" ages out (idle), pinned as it was
    assert reg.n_pinned == 1 == reg.summary()["pinned"] and not reg.status("c").known
