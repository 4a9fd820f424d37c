"""What only the tests ask of the radix tree and its tiers: a node's whole token path,
splitting an edge by hand, a lock for a block, the nodes an insert created or an eviction
freed, and what the host tier holds of a prompt."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager

from server.cache.host_tier import HostTier, TierMatch
from server.cache.radix_tree import DetachedNodeError, EvictResult, InsertResult, RadixNode, RadixTree, Tokens


def token_path(node: RadixNode) -> Tokens:
    """All tokens from the root through the end of this node's key."""
    return tuple(itertools.chain.from_iterable(reversed([n.key for n in node.iter_up()])))


def split_node(tree: RadixTree, node: RadixNode, offset: int) -> RadixNode:
    """Split ``node``'s edge after ``offset`` tokens; return the new upper node (``node``
    keeps its identity and becomes the lower part; every value is split with it)."""
    if not node.attached:
        raise DetachedNodeError(f"{node!r} is no longer in the tree")
    if node.is_root or not 0 < offset < len(node.key):
        raise ValueError(f"cannot split {node!r} at offset {offset}")
    return tree._split(node, offset)


@contextmanager
def locked(tree: RadixTree, node: RadixNode) -> Iterator[RadixNode]:
    """``with locked(tree, tip): ...`` locks the path for the block."""
    tree.lock(node)
    try:
        yield node
    finally:
        tree.unlock(node)


def new_tokens(result: InsertResult) -> int:
    return sum(len(n.key) for n in result.new_nodes)


def freed_nodes(result: EvictResult) -> tuple[RadixNode, ...]:
    return tuple(node for node, _ in result.freed)


def host_match(host: HostTier, tokens: list[int]) -> TierMatch:
    """What tier H holds of `tokens` (the router asks the same through one shared walk)."""
    with host.tree.mutex:
        return host.take(host.tree.match_prefix(tokens))
