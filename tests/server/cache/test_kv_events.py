"""KV events: a real ZMQ subscriber decodes what the publisher sends with vLLM's/SGLang's
schema and rebuilds the tree's blocks from them, on a simulated tree (no model) and on a
real arbor-server."""

from __future__ import annotations

import socket
import time

import httpx
import msgspec
import pytest
import zmq

from server.cache.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    KVEventPublisher,
    block_hash,
    exposes_every_interface,
    resolve_endpoint,
    stored_blocks,
)
from tests.server.cache.sim_payload import simulated_tree
from tests.server.conftest import start_server, stop_server

B = 4  # block size of the simulated tree's events


class Subscriber:
    """What a KV-event router keeps: blocks by hash, rebuilt only from the wire."""

    def __init__(self, endpoint: str, topic: bytes = b"") -> None:
        self.sock = zmq.Context.instance().socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, topic)
        self.sock.connect(endpoint)
        self.decoder = msgspec.msgpack.Decoder(KVEventBatch)
        self.blocks: dict[int, tuple[int | None, tuple[int, ...]]] = {}
        self.seqs: list[int] = []
        self.cleared = 0

    def drain(self, until, timeout_s: float = 30.0) -> None:
        """Apply batches until `until()` holds; fail after timeout_s with what was seen."""
        deadline = time.monotonic() + timeout_s
        while not until():
            assert time.monotonic() < deadline, f"events never matched; have {len(self.blocks)} blocks"
            if self.sock.poll(100):
                topic, seq, payload = self.sock.recv_multipart()
                self.seqs.append(int.from_bytes(seq, "big"))
                self.apply(self.decoder.decode(payload))

    def apply(self, batch: KVEventBatch) -> None:
        for ev in batch.events:
            if isinstance(ev, AllBlocksCleared):
                self.blocks.clear()
                self.cleared += 1
            elif isinstance(ev, BlockRemoved):
                for h in ev.block_hashes:
                    self.blocks.pop(h, None)
            else:
                assert isinstance(ev, BlockStored) and len(ev.token_ids) == ev.block_size * len(ev.block_hashes)
                parent = ev.parent_block_hash
                for i, h in enumerate(ev.block_hashes):
                    chunk = tuple(ev.token_ids[i * ev.block_size:(i + 1) * ev.block_size])
                    assert h == block_hash(parent, chunk)  # the chain is what the tokens say
                    self.blocks[h] = (parent, chunk)
                    parent = h

    def paths(self) -> set[tuple[int, ...]]:
        """Every block's full token prefix, walked up its parents (all must be known)."""
        out = set()
        for h in self.blocks:
            toks: list[int] = []
            cur: int | None = h
            while cur is not None:
                parent, chunk = self.blocks[cur]
                toks[:0] = chunk
                cur = parent
            out.add(tuple(toks))
        return out

    def close(self) -> None:
        self.sock.close(linger=0)


def _prefixes(seq, block_size) -> set[tuple[int, ...]]:
    return {tuple(seq[:end]) for end in range(block_size, len(seq) + 1, block_size)}


def test_wire_format_is_sglangs_tagged_arrays():
    """Encoded as SGLang/vLLM do (msgspec array_like + tag): a plain msgpack reader sees
    [ts, [["BlockStored", hashes, parent, tokens, block_size, lora_id], ...]]."""
    batch = KVEventBatch(ts=1.5, events=[BlockStored(block_hashes=[7], parent_block_hash=None,
                                                     token_ids=[1, 2], block_size=2, lora_id=None),
                                         BlockRemoved(block_hashes=[7]), AllBlocksCleared()])
    raw = msgspec.msgpack.decode(msgspec.msgpack.encode(batch))
    assert raw == [1.5, [["BlockStored", [7], None, [1, 2], 2, None], ["BlockRemoved", [7]], ["AllBlocksCleared"]]]


def test_subscriber_view_follows_the_tree(tmp_path):
    tree, insert = simulated_tree(tier="H")
    pub = KVEventPublisher(tree, f"ipc://{tmp_path}/kv.sock", topic="kv", block_size=B, poll_s=0.01)
    sub = Subscriber(pub.endpoint, b"kv")
    try:
        time.sleep(0.3)  # PUB/SUB: a subscriber joining late misses what was sent before
        a = list(range(1, 15))  # 14 tokens: 3 full blocks
        b = [*range(1, 9), 50, 51, 52, 53, 54]  # shares 2 blocks with a, then its own
        with tree.mutex:
            insert(a)
            insert(b)
        want = _prefixes(a, B) | _prefixes(b, B)
        sub.drain(lambda: sub.paths() == want)
        assert set(stored_blocks(tree, B)) == set(sub.blocks)

        with tree.mutex:  # evicting the whole tier removes every block
            tree.flush("H")
        sub.drain(lambda: not sub.blocks)
        assert sub.seqs == sorted(sub.seqs) and len(set(sub.seqs)) == len(sub.seqs)
    finally:
        sub.close()
        pub.close()


@pytest.mark.parametrize("given, used, bind, everywhere", [
    ("5557", "tcp://127.0.0.1:5557", True, False),  # the bare port: loopback
    (":5557", "tcp://127.0.0.1:5557", True, False),
    ("tcp://*:5557", "tcp://*:5557", True, True),
    ("tcp://0.0.0.0:5557", "tcp://0.0.0.0:5557", False, False),  # vLLM's reading: no '*', so connected to
    ("tcp://[::]:5557", "tcp://[::]:5557", True, True),
    ("tcp://router:5557", "tcp://router:5557", False, False),
    ("ipc:///run/kv.sock", "ipc:///run/kv.sock", True, False),
])
def test_endpoint_forms(given, used, bind, everywhere):
    assert resolve_endpoint(given) == (used, bind)
    assert exposes_every_interface(given) is everywhere


def test_a_bare_port_publishes_on_loopback_only():
    tree, insert = simulated_tree(tier="H")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    pub = KVEventPublisher(tree, str(port), block_size=B, poll_s=0.01)
    try:
        assert pub.endpoint == f"tcp://127.0.0.1:{port}"
        sub = Subscriber(pub.endpoint)
        try:
            time.sleep(0.3)
            with tree.mutex:
                insert(list(range(1, 9)))
            sub.drain(lambda: sub.paths() == _prefixes(list(range(1, 9)), B))
        finally:
            sub.close()
    finally:
        pub.close()


@pytest.mark.model
def test_real_server_announces_its_cached_prefixes(tmp_path):
    endpoint = f"ipc://{tmp_path}/arbor-kv.sock"
    server = start_server(tmp_path, "--parallel", "2", "--ctx-size", "4096", "--cache-tiers", "A,S,H",
                          "--kv-events-endpoint", endpoint, "--kv-events-block-size", "16")
    sub = Subscriber(endpoint)
    try:
        system = {"role": "system", "content": "You are a terse assistant for a tide gauge network. " * 6}
        prompts = []
        for question in ("Name one cause of a missing reading.", "Name one cause of a spike."):
            messages = [system, {"role": "user", "content": question}]
            r = httpx.post(server.v1 + "/chat/completions", timeout=120,
                           json={"messages": messages, "max_tokens": 4, "temperature": 0})
            assert r.status_code == 200, r.text
            prompt = httpx.post(server.base_url + "/apply-template", json={"messages": messages},
                                timeout=30).json()["prompt"]
            prompts.append(httpx.post(server.base_url + "/tokenize", json={"content": prompt},
                                      timeout=30).json()["tokens"])
        # the second request shares the system prompt: the cache keeps that prefix (resident,
        # and the first slot's KV written back to host). What it holds is announced: paths that
        # start as one of the prompts does (the answer's tokens may follow), the shared prefix
        # among them.
        shared = next(i for i, (a, b) in enumerate(zip(*prompts)) if a != b)
        sub.drain(lambda: any(len(p) >= shared - 16 for p in sub.paths()))
        paths = sub.paths()
        assert all(any(p[:len(t)] == tuple(t[:len(p)]) for t in prompts) for p in paths), (paths, prompts)

        flushed = httpx.post(server.base_url + "/cache/flush", timeout=60)
        assert flushed.status_code == 200, flushed.text
        sub.drain(lambda: not sub.blocks)
    finally:
        sub.close()
        stop_server(server)
