"""One node of the token radix tree (server/cache/radix_tree.py), and what its values are.

In a module of its own so that the modules the tree uses (eviction policies, the eviction
queue, session lifecycle tags) can name a node without importing the tree: the tree imports
them, they import only this.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, runtime_checkable

Tokens = tuple[int, ...]


@runtime_checkable
class SegmentPayload(Protocol):
    """The KV of one node's token range, in whatever form its tier keeps it."""

    @property
    def n_tokens(self) -> int:
        """Number of tokens covered; equals ``len(node.key)``."""
        ...

    @property
    def nbytes(self) -> int:
        """Bytes charged to the budget of the tier holding the payload."""
        ...

    def split(self, offset: int) -> tuple[SegmentPayload, SegmentPayload]:
        """Split into (first ``offset`` tokens, the rest); ``0 < offset < n_tokens``."""
        ...

    # Optional: ``memory``, the allocation (an object with ``nbytes``) the payload keeps
    # alive with others (views of one buffer, ranges of one file); the tier then charges
    # that allocation once, whole (``TierCounters.held_bytes``). Without it a payload is
    # its own allocation of ``nbytes``.


class RadixNode:
    """One compressed edge of the tree.

    ``key`` holds this node's own tokens; ``start()`` of them precede it on the
    path.  ``values`` maps a tier name to the payload holding this edge's KV
    in that tier; ``holders`` are the sequence ids whose device cells cover
    the whole path through this edge.  ``sessions`` names the sessions whose radix paths pass
    through the node (maintained by ``lifecycle.SessionRegistry``, copied on
    split).  A detached node (``attached`` False) keeps its ``parent`` pointer
    for reference but is no longer reachable from the root.
    """

    __slots__ = (
        "__weakref__",
        "attached",
        "children",
        "holders",
        "id",
        "key",
        "last_access",
        "lock_ref",
        "parent",
        "sessions",
        "tier_children",
        "values",
    )

    def __init__(self, node_id: int, key: Tokens, parent: RadixNode | None, last_access: float) -> None:
        self.id = node_id
        self.key: Tokens = key
        self.parent = parent
        self.children: dict[int, RadixNode] = {}
        self.values: dict[str, SegmentPayload] = {}
        self.holders: set[int] = set()
        self.last_access = last_access
        self.lock_ref = 0
        self.sessions: set[str] = set()
        self.tier_children: dict[str, int] = {}  # per tier: children holding a value in it
        self.attached = True

    @property
    def is_root(self) -> bool:
        return self.parent is None

    @property
    def is_leaf(self) -> bool:
        return not self.children

    def iter_up(self) -> Iterator[RadixNode]:
        """This node, then its ancestors, root excluded."""
        node: RadixNode | None = self
        while node is not None and node.parent is not None:
            yield node
            node = node.parent

    def start(self) -> int:
        """Number of tokens on the path before this node's own key."""
        return sum(len(n.key) for n in self.iter_up()) - len(self.key)

    def __repr__(self) -> str:
        head = ",".join(map(str, self.key[:4])) + ("..." if len(self.key) > 4 else "")
        return (
            f"RadixNode(id={self.id}, key=[{head}] ({len(self.key)}), lock_ref={self.lock_ref}, "
            f"tiers={''.join(sorted(self.values)) or '-'}, holders={sorted(self.holders)}, "
            f"attached={self.attached})"
        )
