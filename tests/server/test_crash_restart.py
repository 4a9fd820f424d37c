"""kill -9 the real arbor-server (issue 14, crash and restart) and start it again on the same
cache directory: the disk index loads, nothing torn or foreign is ever restored (every bad
file is skipped with a log line and counted), and greedy answers equal a `--no-cache`
server's.

(a) kill while the disk writer is writing: a watcher thread polls the cache directory every
    half millisecond and sends SIGKILL the moment a segment's temp file appears, and the test
    checks the temp file outlived the process (the write really was cut). A torn, a foreign
    and a garbage segment file are planted next to it before the restart.
(b) kill in the middle of a streamed answer, with resident owners holding a shared preamble
    and a host tier that has had to evict (full).

No fault-injection knob: writing a ~50-token prompt's KV (1.1 MB, fsynced) takes
milliseconds, long enough for the watcher to see it; a kill that lands after the rename is
retried on a restarted server.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from bench.soak import metrics
from tests.server.conftest import RunningServer, start_server, stop_server

pytestmark = pytest.mark.model

WORDS = ("pump valve sensor alarm shift report pressure flow tank motor fan belt filter relay switch panel cable "
         "bearing seal gauge meter line crew ticket").split()
PREAMBLE = ("Maintenance log of the edge team. Devices: pump-1, pump-2, compressor-7, fan-3, relay-9. "
            "Every entry names a device, a reading and an action.\n")
MAX_TOKENS = 6


def notes(n: int, seed: int, words: int = 40) -> list[str]:
    """Distinct prompts of about 50 tokens: each one's KV is a segment file of its own."""
    rng = random.Random(seed)
    return [f"Note {seed}-{i}: " + " ".join(rng.choice(WORDS) for _ in range(words)) + "\nSummary:"
            for i in range(n)]


def cache_args(cache_dir: Path, *, parallel: int = 1, ram_mib: int = 16, resident_cells: int = 256) -> list[str]:
    return ["--parallel", str(parallel), "--ctx-size", str(2048 * parallel), "--batch-size", "128",
            "--cache-tiers", "A,S,H,D", "--cache-dir", str(cache_dir), "--cache-ram", str(ram_mib),
            "--cache-disk", "256", "--resident-cells", str(resident_cells), "--cache-min-tokens", "16"]


def complete(server: RunningServer, prompt: str, **fields) -> dict:
    body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, **fields}
    r = httpx.post(server.v1 + "/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text[:2000]
    return r.json()


def answers(server: RunningServer, prompts: list[str]) -> list[tuple[str, str]]:
    """(text, cache source) of the greedy answer to each prompt, in order."""
    out = []
    for p in prompts:
        got = complete(server, p)
        out.append((got["choices"][0]["text"], got["arbor"]["cache"]["source"]))
    return out


def kill9(server: RunningServer) -> None:
    if server.proc.poll() is None:
        os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait(timeout=30)
    assert server.proc.returncode == -signal.SIGKILL


def disk_stats(server: RunningServer) -> dict:
    return httpx.get(server.base_url + "/cache/stats", timeout=60).json()["tiers"]


def segment_files(cache_dir: Path) -> set[Path]:
    return set(cache_dir.glob("*.kvseg"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """A `--no-cache` server: the answers every restarted cache must reproduce."""
    server = start_server(tmp_path_factory.mktemp("reference"), "--parallel", "1", "--ctx-size", "2048",
                          "--batch-size", "128", "--no-cache")
    yield server
    stop_server(server)


def kill_during_a_write(tmp_path: Path, cache_dir: Path, warmup: list[str], prompts: list[str]) -> set[str]:
    """Start a server on `cache_dir`; answer `warmup` and let the disk writer finish their
    segments; then send `prompts` with a watcher armed that SIGKILLs the server as soon as a
    segment's temp file appears. Returns the temp files the dead process left (empty when the
    kill came too late: the file had been renamed, or no write started)."""
    server = start_server(tmp_path, *cache_args(cache_dir))
    seen: list[str] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for entry in os.scandir(cache_dir):
                if entry.name.endswith(".tmp"):
                    os.kill(server.proc.pid, signal.SIGKILL)  # first, before anything else
                    seen.append(entry.name)
                    return
            time.sleep(0.0005)  # a temp file lives for milliseconds; a busy loop would steal a core

    watcher = threading.Thread(target=watch, daemon=True)
    try:
        for prompt in warmup:
            complete(server, prompt, max_tokens=2)
        wait_for_writes(server)
        watcher.start()
        for prompt in prompts:
            try:
                complete(server, prompt, max_tokens=2)
            except httpx.HTTPError:
                break  # killed under this request
            if seen:
                break
    finally:
        done.set()
        if watcher.is_alive():
            watcher.join(timeout=10)
        if server.proc.poll() is None:
            kill9(server)
        server.proc.wait(timeout=30)
    return {p.name for p in cache_dir.glob("*.tmp")} if seen else set()


def wait_for_writes(server: RunningServer, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while disk_stats(server)["D"]["pending_writes"] and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)  # the last dequeued write may still be in flight


def plant_bad_files(cache_dir: Path) -> dict[str, Path]:
    """Next to the real files: a torn copy of one (its body cut short), a sound file of another
    model over the same tokens, and garbage. None of them may ever be restored."""
    from server.cache.disk_tier import encode_segment, read_header, read_segment_file, write_segment_file

    real = sorted(segment_files(cache_dir), key=lambda p: p.stat().st_mtime)[0]
    header, _, _ = read_header(real)
    data = real.read_bytes()
    torn = cache_dir / "planted-torn.kvseg"
    torn.write_bytes(data[: len(data) * 2 // 3])
    other = write_segment_file(cache_dir, encode_segment("another-model-" + header["fingerprint"], header["tokens"],
                                                         read_segment_file(real, header["fingerprint"])))
    garbage = cache_dir / "planted-garbage.kvseg"
    garbage.write_bytes(os.urandom(4096))
    return {"torn": torn, "foreign": other.path, "garbage": garbage}


def test_kill_during_a_disk_write_then_restart(tmp_path, reference):
    cache_dir = tmp_path / "kv"
    cache_dir.mkdir()
    prompts = notes(12, seed=1)
    written = prompts[:2]  # answered first: the next prompt's arrival writes their KV to disk
    left: set[str] = set()
    for attempt in range(4):  # the watcher can lose the race against a rename: kill again
        left = kill_during_a_write(tmp_path, cache_dir, written if attempt == 0 else [],
                                   prompts[2 + attempt * 2:])
        if left:
            break
    assert left, "no kill landed while a segment file was being written (4 attempts)"
    assert segment_files(cache_dir), "the warm-up's segments were whole before the kill"
    planted = plant_bad_files(cache_dir)
    good = segment_files(cache_dir) - set(planted.values())

    server = start_server(tmp_path, *cache_args(cache_dir))
    try:
        assert not list(cache_dir.glob("*.tmp")), "the unfinished write is deleted at start"
        d = disk_stats(server)["D"]
        assert (d["skipped_files"], d["corrupt_files"], d["foreign_files"]) == (3, 2, 1), d
        assert d["files"] == len(good), "every whole file is indexed, and nothing else"
        m = metrics(server.base_url)
        assert m["arbor:cache_disk_corrupt_total"] == 2 and m["arbor:cache_disk_foreign_total"] == 1
        for name, path in planted.items():
            assert path.exists(), f"the {name} file is skipped, not deleted"
            assert path.name in server.log(), f"the {name} file is named in a log line"

        # The prompts written before the kill: served from disk, answered as without a cache.
        asked = written
        got = answers(server, asked)
        assert [text for text, _ in got] == [text for text, _ in answers(reference, asked)]
        assert "D" in {source for _, source in got}, got
        d = disk_stats(server)["D"]
        assert d["corrupt_files"] == 2 and d["hits"] >= 1, "nothing failed its checksum at restore"
    finally:
        stop_server(server)


def test_kill_mid_stream_with_resident_owners_and_a_full_host_tier_then_restart(tmp_path, reference):
    cache_dir = tmp_path / "kv"
    shared = [PREAMBLE + q for q in ("Which pump failed?", "What did the crew do on fan-3?")]
    unique = notes(3, seed=2)
    # 2 MiB of host tier holds about 90 tokens: a few ~50-token segments overflow it
    server = start_server(tmp_path, *cache_args(cache_dir, parallel=2, ram_mib=2, resident_cells=512))
    try:
        for prompt in shared + unique:
            complete(server, prompt, max_tokens=2)
        tiers = disk_stats(server)
        assert tiers["S"]["entries"] >= 1, f"a resident owner holds the shared preamble: {tiers['S']}"
        assert tiers["H"]["evictions"] >= 1 and tiers["H"]["bytes"] > tiers["H"]["budget_bytes"] // 2, tiers["H"]
        written = tiers["D"]["files"]
        assert written >= 1

        body = {"prompt": PREAMBLE + "Write the full maintenance report:", "max_tokens": 400, "temperature": 0,
                "ignore_eos": True, "stream": True}
        chunks = 0
        with httpx.stream("POST", server.v1 + "/completions", json=body, timeout=120) as stream:
            for line in stream.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    choice = json.loads(line[6:])["choices"][0]
                    assert choice["finish_reason"] is None, "the stream ended before the kill"
                    chunks += 1
                    if chunks == 5:
                        kill9(server)
                        break
        assert chunks == 5
    finally:
        if server.proc.poll() is None:
            kill9(server)

    restarted = start_server(tmp_path, *cache_args(cache_dir, parallel=2, ram_mib=2, resident_cells=512))
    try:
        d = disk_stats(restarted)["D"]
        assert d["files"] >= written and (d["corrupt_files"], d["foreign_files"], d["skipped_files"]) == (0, 0, 0), d
        assert d["files"] == len(segment_files(cache_dir))
        asked = [shared[0], unique[0]]
        got = answers(restarted, asked)
        assert [text for text, _ in got] == [text for text, _ in answers(reference, asked)]
        assert "D" in {source for _, source in got}, got
    finally:
        stop_server(restarted)
