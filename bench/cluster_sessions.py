"""Drive agent sessions through a router and record where each turn ran.

A session's turns go one after another (turn k+1 is sent when turn k has answered and its
tool has run, as an agent does); `concurrency` sessions run at a time. Each turn carries the
session as a cache hint in the body (`"cache": {"session": ...}`, as the workbench sends it:
SMG forwards the body's unknown fields, but of the headers only an allow-list, without
`X-Arbor-*`), and the replica that served it is read from SMG's `x-smg-routed-worker-id`
response header.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx

from harness.manifest import ManifestLine

ROUTED_HEADER = "x-smg-routed-worker-id"


@dataclass(frozen=True)
class Turn:
    session: str
    index: int  # the turn's place in its session
    status: int
    replica: str | None  # the worker URL the router chose (None when it answered itself)
    prompt_tokens: int
    cached_tokens: int
    error: str | None = None
    latency_s: float = 0.0  # client-side, request sent to answer read
    prompt_ms: float | None = None  # the server's prefill time (its `timings`): its time to first token
    prompt_n: int | None = None  # the prompt tokens the server says it computed (its `timings.prompt_n`)

    @property
    def computed(self) -> int:
        return self.prompt_tokens - self.cached_tokens


@dataclass(frozen=True)
class SessionRun:
    turns: list[Turn]

    def by_session(self) -> dict[str, list[Turn]]:
        out: dict[str, list[Turn]] = defaultdict(list)
        for t in self.turns:
            out[t.session].append(t)
        return {s: sorted(ts, key=lambda t: t.index) for s, ts in out.items()}

    def affinity(self) -> dict[str, float]:
        """Per session: the share of its turns served by its most used replica."""
        return {s: Counter(t.replica for t in ts).most_common(1)[0][1] / len(ts)
                for s, ts in self.by_session().items()}

    def home(self) -> dict[str, str | None]:
        """Per session: its most used replica."""
        return {s: Counter(t.replica for t in ts).most_common(1)[0][0] for s, ts in self.by_session().items()}

    def computed(self, source: str = "usage") -> int:
        """Computed prompt tokens of the answered turns: from `usage` (prompt_tokens less
        cached_tokens, what arbor-server reports) or from the server's own `timings.prompt_n`
        (what stock llama-server counts it computed; a turn without it counts as usage says)."""
        if source == "timings":
            return sum(t.computed if t.prompt_n is None else t.prompt_n for t in self.turns if t.status == 200)
        if source != "usage":
            raise ValueError(f"unknown source of computed tokens: {source!r}")
        return sum(t.computed for t in self.turns if t.status == 200)

    def statuses(self) -> Counter:
        return Counter(t.status for t in self.turns)


async def drive(router_url: str, lines: Sequence[ManifestLine], concurrency: int, timeout_s: float = 300.0,
                after_turn: Callable[[Turn], None] | None = None, think_max_s: float = 0.0,
                seed: int = 0) -> SessionRun:
    """Send every session of `lines` through `router_url` (its /v1/chat/completions);
    `after_turn` is called after each answer (the failover test kills a replica from it).
    Before each later turn a session "runs its tool" for a seeded random 0..think_max_s
    seconds: without it, sessions in lockstep arrive in a fixed order, and with an even
    number of them round_robin over two replicas sends each session back to the same one
    by accident. Transport errors are recorded as status 0, never raised."""
    rng = random.Random(seed)
    sessions: dict[str, list[ManifestLine]] = defaultdict(list)
    for line in lines:
        sessions[line.session_id].append(line)
    gate = asyncio.Semaphore(concurrency)
    turns: list[Turn] = []

    async with httpx.AsyncClient(base_url=router_url, timeout=timeout_s) as client:
        async def one_session(name: str, session_lines: list[ManifestLine]) -> None:
            async with gate:
                for k, line in enumerate(session_lines):
                    if k and think_max_s:
                        await asyncio.sleep(rng.uniform(0.0, think_max_s))
                    turn = await _send(client, name, k, line)
                    turns.append(turn)
                    if after_turn is not None:
                        after_turn(turn)

        await asyncio.gather(*(one_session(n, ls) for n, ls in sessions.items()))
    return SessionRun(turns)


def endpoint(body: dict) -> str:
    """A chat body (messages) goes to /v1/chat/completions, a prompt body to /v1/completions."""
    return "/v1/chat/completions" if "messages" in body else "/v1/completions"


async def _send(client: httpx.AsyncClient, session: str, k: int, line: ManifestLine) -> Turn:
    t0 = time.perf_counter()
    try:
        r = await client.post(endpoint(line.body), json={**line.body, "cache": {"session": session}})
    except httpx.HTTPError as exc:
        return Turn(session, k, 0, None, 0, 0, error=f"{type(exc).__name__}: {exc}")
    latency = time.perf_counter() - t0
    if r.status_code != 200:
        return Turn(session, k, r.status_code, r.headers.get(ROUTED_HEADER), 0, 0, error=r.text[:500],
                    latency_s=latency)
    answer = r.json()
    usage = answer["usage"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    timings = answer.get("timings") or {}
    return Turn(session, k, 200, r.headers.get(ROUTED_HEADER), usage["prompt_tokens"], cached,
                latency_s=latency, prompt_ms=timings.get("prompt_ms"), prompt_n=timings.get("prompt_n"))
