"""What one budget eviction costs as the radix tree grows (no model: synthetic payloads).

    python -m bench.tree_evict [--sizes 1000,10000,50000] [--out bench/results/tree_evict.json]

For each size the tree holds that many H values (paths of 32 tokens branching off shared
trunks, as agent sessions do); each measured call evicts one value, as a store that needs a
little room does. The tier's bottoms and their eviction order are kept as values come and
go (server/cache/eviction_queue.py), so an eviction's cost should barely grow with the tree;
`first_evict_us` is the first call, which ranks the bottoms once; `scan_us` is what only
walking every node once costs (what each eviction paid before, on top of ranking).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

from server.cache.eviction import LRUPolicy
from server.cache.radix_tree import RadixTree


@dataclass(frozen=True)
class Payload:
    n_tokens: int

    @property
    def nbytes(self) -> int:
        return self.n_tokens * 64

    def split(self, offset: int) -> tuple[Payload, Payload]:
        return Payload(offset), Payload(self.n_tokens - offset)


def build(n_values: int, seed: int = 0) -> RadixTree:
    rng = random.Random(seed)
    tree = RadixTree()
    trunks = [[rng.randrange(50_000) for _ in range(64)] for _ in range(max(1, n_values // 200))]
    while tree.tier("H").n_payloads < n_values:
        path = rng.choice(trunks)[: rng.randrange(8, 64)] + [rng.randrange(50_000) for _ in range(32)]
        tree.insert(path, "H", lambda s, e: Payload(e - s))
    return tree


def measure(n_values: int, calls: int = 200) -> dict:
    tree = build(n_values)
    policy = LRUPolicy()
    t0 = time.perf_counter()
    tree.evict(1, "H", policy)  # the first one ranks the tier's bottoms (once per policy)
    first_us = (time.perf_counter() - t0) * 1e6
    t0 = time.perf_counter()
    for _ in range(calls):
        tree.evict(1, "H", policy)
    evict_us = (time.perf_counter() - t0) / calls * 1e6
    t0 = time.perf_counter()
    for _ in range(20):
        for _node in tree.nodes():
            pass
    scan_us = (time.perf_counter() - t0) / 20 * 1e6
    return {"values": n_values, "nodes": tree.n_nodes, "first_evict_us": round(first_us, 1),
            "evict_us": round(evict_us, 1), "scan_us": round(scan_us, 1)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1000,10000,50000")
    p.add_argument("--out", type=Path, default=Path("bench/results/tree_evict.json"))
    args = p.parse_args(argv)
    rows = [measure(int(n)) for n in args.sizes.split(",")]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2) + "\n")
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
