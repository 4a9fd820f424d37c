"""KV cache events in the ZMQ wire format of vLLM and SGLang workers, for KV-event routers.

Routers that index workers' caches exactly (NVIDIA Dynamo's KV router, llm-d's KV cache
manager) subscribe to each worker's ZMQ PUB socket and read multipart messages
``[topic, seq, payload]``: ``seq`` an 8-byte big-endian counter, ``payload`` a msgpack
``KVEventBatch`` ``[ts, [event, ...]]`` whose events are the tagged arrays
``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id]``,
``["BlockRemoved", block_hashes]`` and ``["AllBlocksCleared"]``. The structs below are
SGLang's (python/sglang/srt/disaggregation/kv_events.py) field for field, encoded the same
way (msgspec, ``array_like``, ``tag``, ``omit_defaults``); vLLM's (vllm/distributed/
kv_events.py) add optional fields after these, which its consumers default.

Arbor's radix tree holds token segments of any length, not fixed blocks, so the events
describe it in fixed blocks of ``block_size`` tokens: a full block on a root path is *stored*
when every node from the root through the block holds its KV somewhere (a value in S, H or
D, or a resident owner's cells); a block's hash chains its parent's hash and its tokens, so
equal prefixes have equal hashes on every replica (a cache namespace's, `cache_salt`, only
within the namespace: its first block hashes it). Slots' own kept KV (tier A) is not in the
tree and is not announced.

Publishing never runs on the engine thread: a publisher thread notices changes from the
tree's counters (cheap reads), snapshots the tree's structure under ``tree.mutex`` (a walk
of the nodes, no hashing), then hashes, diffs against what it announced last and sends, all
outside the lock. Changes between two looks are coalesced, which routers tolerate (they
index state, not history). A full look also runs every ``FULL_CHECK_S`` in case a change
left every counter as it was.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from array import array
from dataclasses import dataclass
from itertools import count
from typing import Any

import msgspec
import zmq

from server.cache.radix_tree import RadixNode, RadixTree
from server.cache.tiers import ON_TREE
from server.engine.cache_namespace import split

log = logging.getLogger(__name__)

FULL_CHECK_S = 2.0


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Base of the tagged events (the tag is the class name, as in vLLM and SGLang)."""


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]


class AllBlocksCleared(KVCacheEvent):
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


def block_hash(parent: int | None, tokens: tuple[int, ...], namespace: bytes | None = None) -> int:
    """The block's hash: a signed 64-bit int (msgpack int64, as SGLang's) of blake2b over the
    parent's hash and the block's tokens, so it names the whole prefix up to the block's end.
    A first block in a cache namespace (`cache_salt`) hashes the namespace too, as vLLM's
    first block hashes the salt: its chain names no prefix of another namespace or of none."""
    h = hashlib.blake2b(digest_size=8)
    h.update((parent if parent is not None else 0).to_bytes(8, "little", signed=True))
    h.update(array("q", tokens).tobytes())
    if namespace is not None:
        h.update(b"|namespace|" + namespace)
    return int.from_bytes(h.digest(), "little", signed=True)


@dataclass(frozen=True)
class Block:
    hash: int
    parent: int | None
    tokens: tuple[int, ...]


def stored_blocks(tree: RadixTree, block_size: int) -> dict[int, Block]:
    """Every full block the tree holds KV for (see the module docstring), by hash.
    Takes ``tree.mutex`` only to copy the structure; hashing runs after."""
    with tree.mutex:
        paths = _held_paths(tree.root)
    out: dict[int, Block] = {}
    for keys in paths:
        # a namespace's path starts with its marker: the real tokens are announced, the
        # namespace goes into the hashes (server/engine/cache_namespace.py)
        namespace, ids = split(tuple(t for key in keys for t in key))
        tokens = tuple(ids)
        parent: int | None = None
        for end in range(block_size, len(tokens) + 1, block_size):
            chunk = tokens[end - block_size:end]
            h = block_hash(parent, chunk, namespace if parent is None else None)
            out.setdefault(h, Block(h, parent, chunk))
            parent = h
    return out


def _held_paths(root: RadixNode) -> list[tuple[tuple[int, ...], ...]]:
    """The keys along each path from the root to a deepest node whose whole path holds KV
    (a node with values or holders). Keys are immutable tuples, so the caller joins them after
    releasing the lock: under it, only references are collected."""
    ends: list[tuple[tuple[int, ...], ...]] = []
    stack: list[tuple[RadixNode, tuple[tuple[int, ...], ...]]] = [(root, ())]
    while stack:
        node, keys = stack.pop()
        held_children = [c for c in node.children.values() if c.values or c.holders]
        if not held_children and keys:
            ends.append(keys)
        for c in held_children:
            stack.append((c, (*keys, c.key)))
    return ends


def diff_events(before: dict[int, Block], after: dict[int, Block], block_size: int) -> list[KVEvent]:
    """Events that turn a subscriber's view `before` into `after`: removals first (deepest
    blocks first does not matter to indexers keyed by hash), then stores parents-first, one
    BlockStored per chain run so `parent_block_hash` links each run to what precedes it."""
    events: list[KVEvent] = []
    gone = [h for h in before if h not in after]
    if gone:
        events.append(BlockRemoved(block_hashes=gone))
    new = {h: b for h, b in after.items() if h not in before}
    # a new block whose parent is also new continues its parent's run
    heads = [b for b in new.values() if b.parent not in new]
    children: dict[int | None, list[Block]] = {}
    for b in new.values():
        children.setdefault(b.parent, []).append(b)
    for head in heads:
        stack = [head]
        while stack:
            run = [stack.pop()]
            while True:
                kids = children.get(run[-1].hash, [])
                if not kids:
                    break
                run.append(kids[0])
                stack.extend(kids[1:])
            events.append(BlockStored(block_hashes=[b.hash for b in run], parent_block_hash=run[0].parent,
                                      token_ids=[t for b in run for t in b.tokens], block_size=block_size,
                                      lora_id=None))
    return events


def resolve_endpoint(endpoint: str) -> tuple[str, bool]:
    """The ZMQ endpoint to use and whether to bind it. A bare port (``5557`` or ``:5557``)
    binds loopback, ``tcp://127.0.0.1:PORT``: the events carry the token ids of every cached
    prefix (what users' prompts say), so the form without an address keeps them on this
    machine. Anything else as vLLM reads it: with ``*`` or ``::``, or ``ipc://``/``inproc://``,
    bound; otherwise connected to (the subscriber binds)."""
    bare = endpoint[1:] if endpoint.startswith(":") else endpoint
    if bare.isdigit():
        return f"tcp://127.0.0.1:{int(bare)}", True
    return endpoint, "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def exposes_every_interface(endpoint: str) -> bool:
    """True when the endpoint binds every network interface (``tcp://*``, ``0.0.0.0``, ``[::]``)."""
    endpoint, bind = resolve_endpoint(endpoint)
    host = endpoint.removeprefix("tcp://").rsplit(":", 1)[0]
    return bind and endpoint.startswith("tcp://") and host in ("*", "0.0.0.0", "[::]", "::", "[*]")


class KVEventPublisher:
    """Publishes the tree's block changes on a ZMQ PUB socket from its own thread.

    ``endpoint`` (see ``resolve_endpoint``): a bare port binds loopback; otherwise as vLLM's,
    one with ``*`` (``tcp://*:5557``), ``::``, ``ipc://`` or ``inproc://`` is bound, any
    other connected to. ``close()`` stops the thread and closes the socket. The first batch after start
    is an ``AllBlocksCleared`` followed by
    what the tree already holds, so a subscriber that reconnects can reset its view.
    """

    def __init__(self, tree: RadixTree, endpoint: str, topic: str = "", block_size: int = 16,
                 poll_s: float = 0.05) -> None:
        self.tree = tree
        self.block_size = block_size
        self.poll_s = poll_s
        self._topic = topic.encode()
        self._seq = count()
        self._encoder = msgspec.msgpack.Encoder()
        self._ctx: zmq.Context[Any] = zmq.Context.instance()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(100_000)
        endpoint, bind = resolve_endpoint(endpoint)
        if bind:
            self._pub.bind(endpoint)
        else:
            self._pub.connect(endpoint)
        self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT) or endpoint
        self._announced: dict[int, Block] = {}
        self._signature: tuple | None = None
        self._stop = threading.Event()
        self.batches_sent = 0
        self.errors = 0
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._pub.close(linger=0)

    def _tree_signature(self) -> tuple:
        t = self.tree
        return (t.n_nodes, t.n_tokens, t.held_tokens,
                tuple((c.n_payloads, c.payload_tokens) for c in map(t.tier, ON_TREE)))

    def _run(self) -> None:
        self._send([AllBlocksCleared()])
        last_full = 0.0
        while not self._stop.wait(self.poll_s):
            try:
                sig = self._tree_signature()
                now = time.monotonic()
                if sig == self._signature and now - last_full < FULL_CHECK_S:
                    continue
                self._signature, last_full = sig, now
                current = stored_blocks(self.tree, self.block_size)
                events = diff_events(self._announced, current, self.block_size)
                self._announced = current
                if events:
                    self._send(events)
            except Exception:  # the cache may make routing worse, never the server fail
                self.errors += 1
                log.exception("kv events: publishing failed")
                time.sleep(1.0)

    def _send(self, events: list[KVEvent]) -> None:
        payload = self._encoder.encode(KVEventBatch(ts=time.time(), events=events))
        self._pub.send_multipart((self._topic, next(self._seq).to_bytes(8, "big"), payload))
        self.batches_sent += 1


def start_kv_events(settings, tree: RadixTree | None) -> KVEventPublisher | None:
    """The publisher `--kv-events-endpoint` asks for (None when it is not set). The settings
    refuse the flag without a tree (no tier S, H or D), so `tree` is there when it is set."""
    if settings.kv_events_endpoint is None:
        return None
    if tree is None:
        raise RuntimeError("--kv-events-endpoint needs the radix tree (a cache tier S, H or D)")
    pub = KVEventPublisher(tree, settings.kv_events_endpoint, settings.kv_events_topic,
                           settings.kv_events_block_size)
    log.info("kv events: publishing on %s (topic %r, blocks of %d tokens)", pub.endpoint,
             settings.kv_events_topic, settings.kv_events_block_size)
    if exposes_every_interface(settings.kv_events_endpoint):
        log.warning("kv events: %s is bound on every interface: anyone who can reach that port reads the token ids "
                    "of every cached prefix (the text of users' prompts). Use a bare port (loopback) or a "
                    "firewall/private network that only the router reaches", pub.endpoint)
    return pub
