"""Token-level radix tree of KV segments (Host Radix + Direct KV).

Each node owns one compressed edge of tokens (``key``) and, optionally, an
opaque ``payload`` that covers exactly that edge: a *segment*.  A request's
cached prefix is the concatenation of the segments along its radix path, so
the tree stores shared prefixes once and each branch only as its increment.

Contracts the rest of the cache relies on:

* A segment's KV is valid only on its own radix path (the KV of a token
  depends on every token before it).  The tree never moves a payload to
  another path; splitting an edge splits its payload with it.
* ``payload.n_tokens == len(node.key)`` whenever a payload is present.
* A node's key is never empty (except the root's); no two siblings share a
  first token.
* Nodes with ``lock_ref > 0`` are never evicted; locking a node locks its
  whole path to the root.
* ``evictable_bytes``/``protected_bytes``/``total_bytes``/``n_nodes``/
  ``n_tokens`` are kept incrementally; ``check_invariants()`` recomputes them.

The tree is pure bookkeeping: it never touches llama.cpp.  The owner turns
payloads into KV (restore), creates them (extract) and releases them (the
``on_evict`` hook).  It is not thread-safe: the owner serialises access
(the engine loop is one thread).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from server.cache.eviction import EvictionPolicy

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


PayloadFactory = Callable[[int, int], "SegmentPayload | None"]
"""``payload_for_range(start, end)``: the payload for tokens ``[start, end)`` of
the sequence being inserted, or None when the caller has none for that range."""


class RadixTreeError(Exception):
    """Base class of errors raised by the radix tree on misuse."""


class NodeLockedError(RadixTreeError):
    """The operation would remove or alter a node that a reader has locked."""


class DetachedNodeError(RadixTreeError):
    """The node is no longer in the tree (it was evicted or pruned)."""


class PayloadSizeError(RadixTreeError, ValueError):
    """A payload does not cover exactly its node's token range."""


class TreeInvariantError(AssertionError):
    """``check_invariants`` found the tree inconsistent (a bug, never user input)."""


class RadixNode:
    """One compressed edge of the tree.

    ``key`` holds this node's own tokens; ``start()`` of them precede it on the
    path.  ``sessions`` names the sessions whose radix paths pass through the
    node (maintained by ``lifecycle.SessionRegistry``, copied on split).  A
    detached node (``attached`` False) keeps its ``parent`` pointer for
    reference but is no longer reachable from the root.
    """

    __slots__ = (
        "__weakref__",
        "attached",
        "children",
        "id",
        "key",
        "last_access",
        "lock_ref",
        "parent",
        "payload",
        "sessions",
    )

    def __init__(self, node_id: int, key: Tokens, parent: RadixNode | None, last_access: float) -> None:
        self.id = node_id
        self.key: Tokens = key
        self.parent = parent
        self.children: dict[int, RadixNode] = {}
        self.payload: SegmentPayload | None = None
        self.last_access = last_access
        self.lock_ref = 0
        self.sessions: set[str] = set()
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

    def token_path(self) -> Tokens:
        """All tokens from the root through the end of this node's key."""
        parts = [n.key for n in self.iter_up()]
        return tuple(itertools.chain.from_iterable(reversed(parts)))

    def __repr__(self) -> str:
        head = ",".join(map(str, self.key[:4])) + ("..." if len(self.key) > 4 else "")
        return (
            f"RadixNode(id={self.id}, key=[{head}] ({len(self.key)}), lock_ref={self.lock_ref}, "
            f"payload={'yes' if self.payload is not None else 'no'}, attached={self.attached})"
        )


@dataclass(frozen=True)
class MatchResult:
    """Longest prefix of a token sequence present in the tree.

    ``length`` tokens are covered by the whole nodes in ``path`` (root
    excluded; ``last_node`` is the deepest of them, or the root).  The match
    may continue ``partial_tokens`` tokens into ``partial_node``'s edge; those
    are usable only after ``RadixTree.split_node(partial_node, partial_tokens)``
    (the caller decides whether a split is worth it).
    """

    length: int
    path: tuple[RadixNode, ...]
    last_node: RadixNode
    partial_node: RadixNode | None = None
    partial_tokens: int = 0

    @property
    def longest(self) -> int:
        """Tokens matched including the partial overlap into the next edge."""
        return self.length + self.partial_tokens


@dataclass(frozen=True)
class InsertResult:
    """What ``insert`` changed.

    ``prefix_len`` tokens were already present as tree structure; the new
    suffix (if any) is the single node in ``new_nodes``.  ``filled_nodes`` are
    existing payload-less nodes on the path that received a payload.
    ``last_node`` ends exactly at the inserted sequence's end (the tree splits
    an edge to make it so) and ``path`` is the whole path, root excluded.
    """

    prefix_len: int
    new_nodes: tuple[RadixNode, ...]
    filled_nodes: tuple[RadixNode, ...]
    last_node: RadixNode
    path: tuple[RadixNode, ...]

    @property
    def new_tokens(self) -> int:
        return sum(len(n.key) for n in self.new_nodes)


@dataclass(frozen=True)
class EvictResult:
    """What ``evict``/``flush`` removed, in eviction order.

    ``freed_bytes`` is the sum of the freed payloads' ``nbytes``: what the
    tree really released, which may fall short of ``requested_bytes`` when
    not enough is evictable (see ``satisfied``).
    """

    requested_bytes: int | None
    freed_nodes: tuple[RadixNode, ...]
    freed_bytes: int
    freed_tokens: int

    @property
    def satisfied(self) -> bool:
        return self.requested_bytes is None or self.freed_bytes >= self.requested_bytes


@dataclass(frozen=True)
class TreeStats:
    """Snapshot of the tree counters (for /cache/stats and metrics)."""

    n_nodes: int
    n_tokens: int
    n_payloads: int
    payload_tokens: int
    total_bytes: int
    evictable_bytes: int
    protected_bytes: int


def _full_match(key: Tokens, tokens: Tokens, pos: int) -> int:
    """Length of the common prefix of ``key`` and ``tokens[pos:]``."""
    end = pos + len(key)
    if tokens[pos:end] == key:
        return len(key)
    n = 0
    for a, b in zip(key, tokens[pos:end]):
        if a != b:
            break
        n += 1
    return n


class RadixTree:
    """Radix tree of token-range payloads; see the module docstring for contracts.

    ``clock`` returns the access stamp stored in ``last_access`` (default: a
    per-tree counter, which is strictly increasing and so deterministic).
    ``on_evict(node)`` is called for every node removed by ``evict``/``flush``,
    after it is detached and with its payload still set, so the owner can
    release it (RAM, file).  The callback must not modify the tree.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] | None = None,
        on_evict: Callable[[RadixNode], None] | None = None,
    ) -> None:
        self._ids = itertools.count()
        self._clock: Callable[[], float] = clock if clock is not None else itertools.count(1).__next__
        self.on_evict = on_evict
        self.root = RadixNode(next(self._ids), (), None, self._clock())
        self.evictable_bytes = 0
        self.protected_bytes = 0
        self.n_nodes = 0
        self.n_tokens = 0
        self.n_payloads = 0
        self.payload_tokens = 0

    @property
    def total_bytes(self) -> int:
        return self.evictable_bytes + self.protected_bytes

    # ------------------------------------------------------------------ match

    def match_prefix(
        self, tokens: Sequence[int], *, require_payload: bool = False, touch: bool = True
    ) -> MatchResult:
        """Find the longest prefix of ``tokens`` held by the tree.

        With ``require_payload`` the walk stops before the first node without
        a payload: KV after a hole on the path cannot be used.  With ``touch``
        the matched whole nodes get a fresh ``last_access`` stamp (the partial
        node does not; the caller touches it after splitting, if it uses it).
        """
        tokens = tuple(tokens)
        node = self.root
        path: list[RadixNode] = []
        pos = 0
        partial_node: RadixNode | None = None
        partial = 0
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None or (require_payload and child.payload is None):
                break
            n = _full_match(child.key, tokens, pos)
            if n < len(child.key):
                partial_node, partial = child, n
                break
            path.append(child)
            pos += n
            node = child
        if touch and path:
            stamp = self._clock()
            for n in path:
                n.last_access = stamp
        return MatchResult(pos, tuple(path), node, partial_node, partial)

    # ----------------------------------------------------------------- insert

    def insert(
        self,
        tokens: Sequence[int],
        payload_for_range: PayloadFactory | None = None,
        *,
        fill_missing: bool = True,
    ) -> InsertResult:
        """Add ``tokens`` as a path, storing only what is new.

        Existing nodes are reused (an edge is split where the sequence leaves
        it or ends inside it); one new node is created for the suffix that is
        not yet present, and ``payload_for_range(start, end)`` is asked for
        that range only.  With ``fill_missing`` it is also asked for the range
        of each existing node on the path that has no payload (a demoted or
        payload-less node), so the path can become usable again; returning
        None leaves such a node as it was.

        If ``payload_for_range`` raises, the tree stays consistent: splits and
        fills already made remain, the new suffix node is not created.
        """
        tokens = tuple(tokens)
        stamp = self._clock()
        node = self.root
        pos = 0
        path: list[RadixNode] = []
        filled: list[RadixNode] = []
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                break
            n = _full_match(child.key, tokens, pos)
            if n < len(child.key):
                child = self._split(child, n)
            end = pos + len(child.key)
            if child.payload is None and fill_missing and payload_for_range is not None:
                payload = payload_for_range(pos, end)
                if payload is not None:
                    self._attach_payload(child, payload)
                    filled.append(child)
            child.last_access = stamp
            path.append(child)
            pos = end
            node = child
        prefix_len = pos
        new_nodes: tuple[RadixNode, ...] = ()
        if pos < len(tokens):
            payload = payload_for_range(pos, len(tokens)) if payload_for_range is not None else None
            if payload is not None:
                self._check_size(payload, len(tokens) - pos)
            leaf = RadixNode(next(self._ids), tokens[pos:], node, stamp)
            node.children[leaf.key[0]] = leaf
            self.n_nodes += 1
            self.n_tokens += len(leaf.key)
            if payload is not None:
                self._attach_payload(leaf, payload)
            path.append(leaf)
            new_nodes = (leaf,)
            node = leaf
        return InsertResult(prefix_len, new_nodes, tuple(filled), node, tuple(path))

    def split_node(self, node: RadixNode, offset: int) -> RadixNode:
        """Split ``node``'s edge after ``offset`` tokens; return the new upper node.

        ``node`` keeps its identity and becomes the lower part (so references
        to a path tip stay valid); its payload is split with it.
        """
        self._require_attached(node)
        if node.is_root or not 0 < offset < len(node.key):
            raise ValueError(f"cannot split {node!r} at offset {offset}")
        return self._split(node, offset)

    def _split(self, child: RadixNode, offset: int) -> RadixNode:
        left = right = None
        if child.payload is not None:
            # Split and check first so a faulty payload leaves the tree untouched.
            left, right = child.payload.split(offset)
            self._check_size(left, offset)
            self._check_size(right, len(child.key) - offset)
            self._account(child, -1)
        parent = child.parent
        assert parent is not None
        upper = RadixNode(next(self._ids), child.key[:offset], parent, child.last_access)
        # Every lock and session passing through the child passes through its upper half.
        upper.lock_ref = child.lock_ref
        upper.sessions = set(child.sessions)
        parent.children[upper.key[0]] = upper
        child.key = child.key[offset:]
        child.parent = upper
        upper.children[child.key[0]] = child
        self.n_nodes += 1
        if left is not None and right is not None:
            upper.payload = left
            child.payload = right
            self._account(upper, +1)
            self._account(child, +1)
        return upper

    # --------------------------------------------------------------- payloads

    def set_payload(self, node: RadixNode, payload: SegmentPayload) -> SegmentPayload | None:
        """Give ``node`` a payload (e.g. a tier move RAM -> disk); return the old one.

        The old payload is not passed to ``on_evict``: the caller owns it now.
        """
        self._require_attached(node)
        if node.is_root:
            raise ValueError("the root holds no payload")
        self._check_size(payload, len(node.key))
        old = node.payload
        if old is not None:
            self._account(node, -1)
            node.payload = None
        self._attach_payload(node, payload)
        return old

    def remove_payload(self, node: RadixNode) -> SegmentPayload | None:
        """Drop ``node``'s payload and return it (the caller releases or moves it).

        The node stays while it has children (it keeps the path to them); a
        payload-less, unlocked leaf is pruned, and so are payload-less unlocked
        ancestors that become leaves.  Raises NodeLockedError on a locked node.
        """
        self._require_attached(node)
        if node.is_root:
            raise ValueError("the root holds no payload")
        if node.lock_ref > 0:
            raise NodeLockedError(f"cannot remove the payload of locked {node!r}")
        old = node.payload
        if old is not None:
            self._account(node, -1)
            node.payload = None
        cur: RadixNode | None = node
        while (
            cur is not None
            and not cur.is_root
            and cur.is_leaf
            and cur.payload is None
            and cur.lock_ref == 0
        ):
            parent = cur.parent
            self._detach_leaf(cur)
            cur = parent
        return old

    @staticmethod
    def _require_attached(node: RadixNode) -> None:
        if not node.attached:
            raise DetachedNodeError(f"{node!r} is no longer in the tree")

    def _attach_payload(self, node: RadixNode, payload: SegmentPayload) -> None:
        self._check_size(payload, len(node.key))
        node.payload = payload
        self._account(node, +1)

    @staticmethod
    def _check_size(payload: SegmentPayload, n_tokens: int) -> None:
        if payload.n_tokens != n_tokens:
            raise PayloadSizeError(f"payload covers {payload.n_tokens} tokens, its range has {n_tokens}")
        if payload.nbytes < 0:
            raise PayloadSizeError(f"payload reports negative size {payload.nbytes}")

    def _account(self, node: RadixNode, sign: int) -> None:
        payload = node.payload
        if payload is None:
            return
        if node.lock_ref > 0:
            self.protected_bytes += sign * payload.nbytes
        else:
            self.evictable_bytes += sign * payload.nbytes
        self.n_payloads += sign
        self.payload_tokens += sign * payload.n_tokens

    # ------------------------------------------------------------------ locks

    def lock(self, node: RadixNode) -> None:
        """Protect ``node`` and its path to the root from eviction (reentrant).

        Locking the root is a no-op (an empty match locks nothing).
        """
        self._require_attached(node)
        for n in node.iter_up():
            if n.lock_ref == 0 and n.payload is not None:
                self.evictable_bytes -= n.payload.nbytes
                self.protected_bytes += n.payload.nbytes
            n.lock_ref += 1

    def unlock(self, node: RadixNode) -> None:
        """Undo one ``lock(node)``."""
        self._require_attached(node)
        path = list(node.iter_up())
        if any(n.lock_ref <= 0 for n in path):
            raise RadixTreeError(f"unlock without a matching lock on {node!r}")
        for n in path:
            n.lock_ref -= 1
            if n.lock_ref == 0 and n.payload is not None:
                self.protected_bytes -= n.payload.nbytes
                self.evictable_bytes += n.payload.nbytes

    @contextmanager
    def locked(self, node: RadixNode) -> Iterator[RadixNode]:
        """``with tree.locked(match.last_node): ...`` locks for the block."""
        self.lock(node)
        try:
            yield node
        finally:
            self.unlock(node)

    def touch(self, node: RadixNode) -> None:
        """Stamp ``node`` and its ancestors as just used."""
        stamp = self._clock()
        for n in node.iter_up():
            n.last_access = stamp

    # --------------------------------------------------------------- eviction

    def evict(self, bytes_needed: int, policy: EvictionPolicy | None = None) -> EvictResult:
        """Remove unlocked leaf segments in policy order until ``bytes_needed`` are freed.

        Whole leaves only; a parent whose children are all gone becomes a
        candidate itself.  Stops early when nothing evictable remains: check
        ``EvictResult.satisfied``.  ``policy=None`` means LRU; a policy may
        return None for a node it refuses to evict now (e.g. pinned).
        """
        if bytes_needed < 0:
            raise ValueError(f"bytes_needed must be >= 0, got {bytes_needed}")
        return self._evict(bytes_needed, policy)

    def flush(self, policy: EvictionPolicy | None = None) -> EvictResult:
        """Evict every node the locks and the policy allow (POST /cache/flush)."""
        return self._evict(None, policy)

    def _evict(self, limit: int | None, policy: EvictionPolicy | None) -> EvictResult:
        freed: list[RadixNode] = []
        freed_bytes = 0
        freed_tokens = 0
        if limit == 0:
            return EvictResult(limit, (), 0, 0)

        def priority(node: RadixNode) -> Hashable | None:
            return (node.last_access,) if policy is None else policy.priority(node)

        heap: list[tuple[Hashable, int, RadixNode]] = []

        def offer(node: RadixNode) -> None:
            if node.is_root or not node.is_leaf or node.lock_ref > 0:
                return
            key = priority(node)
            if key is not None:  # None: the policy refuses to evict this node now
                heapq.heappush(heap, (key, node.id, node))

        for leaf in list(self.leaves()):
            offer(leaf)
        while heap and (limit is None or freed_bytes < limit):
            _, _, node = heapq.heappop(heap)
            if not node.attached or not node.is_leaf or node.lock_ref > 0:
                continue  # defensive: state changed since it was offered
            parent = node.parent
            nbytes = node.payload.nbytes if node.payload is not None else 0
            self._detach_leaf(node)
            freed.append(node)
            freed_bytes += nbytes
            freed_tokens += len(node.key)
            if self.on_evict is not None:
                self.on_evict(node)
            if parent is not None:
                offer(parent)
        return EvictResult(limit, tuple(freed), freed_bytes, freed_tokens)

    def _detach_leaf(self, node: RadixNode) -> None:
        parent = node.parent
        assert parent is not None and node.is_leaf and node.lock_ref == 0
        self._account(node, -1)
        del parent.children[node.key[0]]
        node.attached = False
        self.n_nodes -= 1
        self.n_tokens -= len(node.key)

    # ------------------------------------------------------------- inspection

    def nodes(self) -> Iterator[RadixNode]:
        """All nodes, root excluded, parents before children."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def leaves(self) -> Iterator[RadixNode]:
        return (n for n in self.nodes() if n.is_leaf)

    def stats(self) -> TreeStats:
        return TreeStats(
            n_nodes=self.n_nodes,
            n_tokens=self.n_tokens,
            n_payloads=self.n_payloads,
            payload_tokens=self.payload_tokens,
            total_bytes=self.total_bytes,
            evictable_bytes=self.evictable_bytes,
            protected_bytes=self.protected_bytes,
        )

    def check_invariants(self) -> None:
        """Recompute structure and counters from scratch; raise TreeInvariantError on mismatch."""

        def fail(msg: str) -> None:
            raise TreeInvariantError(msg)

        counts = {"n_nodes": 0, "n_tokens": 0, "n_payloads": 0, "payload_tokens": 0, "evictable": 0, "protected": 0}
        stack = [self.root]
        while stack:
            node = stack.pop()
            if not node.attached:
                fail(f"detached node reachable: {node!r}")
            if node is not self.root:
                if not node.key:
                    fail(f"empty key on {node!r}")
                counts["n_nodes"] += 1
                counts["n_tokens"] += len(node.key)
                if node.lock_ref < 0:
                    fail(f"negative lock_ref on {node!r}")
                if node.payload is not None:
                    if node.payload.n_tokens != len(node.key):
                        fail(f"payload size {node.payload.n_tokens} != key length on {node!r}")
                    counts["n_payloads"] += 1
                    counts["payload_tokens"] += node.payload.n_tokens
                    counts["protected" if node.lock_ref > 0 else "evictable"] += node.payload.nbytes
            child_locks = 0
            for first, child in node.children.items():
                if child.parent is not node:
                    fail(f"bad parent pointer on {child!r}")
                if not child.key or child.key[0] != first:
                    fail(f"{child!r} filed under token {first}")
                child_locks += child.lock_ref
                stack.append(child)
            if node is not self.root and node.lock_ref < child_locks:
                fail(f"{node!r} has lock_ref below its children's sum {child_locks}")
        expected = {
            "n_nodes": self.n_nodes,
            "n_tokens": self.n_tokens,
            "n_payloads": self.n_payloads,
            "payload_tokens": self.payload_tokens,
            "evictable": self.evictable_bytes,
            "protected": self.protected_bytes,
        }
        if counts != expected:
            fail(f"counters {expected} != recomputed {counts}")
