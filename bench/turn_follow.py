"""Following a turn from another workbench process: how late its text arrives, and what the
journal writes.

    python -m bench.turn_follow [--turns 5] [--words 300] [--token-delay-s 0.01]
        [--out bench/results/turn_follow.json]

Two `arbor serve` processes on one PostgreSQL (a throwaway cluster, tests/pg_cluster.py) and
the scripted OpenAI fake of the tests, which streams `--words` words `--token-delay-s` apart.
Each turn is started on process A (its SSE stream is the reference) and followed at once from
process B (`GET /api/turns/{id}/events`, which reads A's journal). For every token A streams,
its lag is the time B had the text up to that token minus the time A's stream had it. Also
reported: journal rows per turn against the events A streamed, and each turn's wall on A.
Nothing is asserted: this measures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

from tests.app.processes import workbench
from tests.app.support import SseReader
from tests.fakes.scripted_openai import ScriptedReply, scripted_server
from tests.pg_cluster import TempCluster
from tests.workbench_auth import AUTH_HEADERS, WORKBENCH_TOKEN


def _text_times(reader: SseReader) -> list[tuple[int, float]]:
    """(characters of text so far, arrival time) after each token event."""
    out, chars = [], 0
    for event, at in zip(reader.events, reader.arrivals):
        if event["type"] == "token":
            chars += len(event["text"])
            out.append((chars, at))
    return out


def _lags_ms(owner: SseReader, follower: SseReader) -> list[float]:
    """For each token A streamed: how much later B had the text up to its end."""
    followed = _text_times(follower)
    return [(next(t for c, t in followed if c >= chars) - at) * 1000 for chars, at in _text_times(owner)]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--words", type=int, default=300)
    parser.add_argument("--token-delay-s", type=float, default=0.01)
    parser.add_argument("--out", type=Path, default=Path("bench/results/turn_follow.json"))
    a = parser.parse_args()
    content = " ".join(f"w{i}" for i in range(a.words))
    os.environ.setdefault("ARBOR_WORKBENCH_TOKEN", WORKBENCH_TOKEN)  # both `arbor serve`s sign us in with it
    cluster = TempCluster().start()
    turns = []
    try:
        with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
            database = cluster.url(cluster.create_database())
            fake = stack.enter_context(scripted_server(
                lambda body: ScriptedReply(content=content, token_delay_s=a.token_delay_s)))
            first, _ = stack.enter_context(workbench(Path(tmp), "a", database, fake.base_url))
            second, _ = stack.enter_context(workbench(Path(tmp), "b", database, fake.base_url))
            session = httpx.post(f"{first}/api/sessions", json={"scenario": "edge_incident"}, timeout=30,
                                 headers=AUTH_HEADERS).json()["id"]
            for i in range(a.turns):
                owner = SseReader("POST", f"{first}/api/sessions/{session}/turns", json={"message": f"turn {i}"})
                started = time.monotonic()
                owner.start()
                owner.wait_for(lambda events: bool(events), "the first event")
                follower = SseReader("GET", f"{second}/api/turns/{owner.events[0]['turn_id']}/events")
                follower.start()
                owner.join(120)
                follower.join(120)
                wall = owner.arrivals[-1] - started
                lags = _lags_ms(owner, follower)
                rows = cluster.query(database.rsplit("/", 1)[-1],
                                     "SELECT count(*) FROM turn_events WHERE turn_id = %s", owner.events[0]["turn_id"])
                turns.append({"owner_events": len(owner.events), "follower_events": len(follower.events),
                              "journal_rows": rows[0][0], "wall_s": round(wall, 3),
                              "same_text": _text_times(owner)[-1][0] == _text_times(follower)[-1][0],
                              "lag_ms_p50": round(statistics.median(lags), 1),
                              "lag_ms_p95": round(_percentile(lags, 0.95), 1), "lag_ms_max": round(max(lags), 1)})
                print(json.dumps(turns[-1]))
    finally:
        cluster.stop()
    result = {"turns": turns, "words": a.words, "token_delay_s": a.token_delay_s,
              "flush_s_default": 0.2, "poll_s_default": 0.25}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
