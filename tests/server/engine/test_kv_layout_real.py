"""The split KV layout (--kv-layout split: a stream per slot) on the real engine (embedded model).

The runtime: a prefix copied between streams gives the source's logits bit for bit; llama.cpp's copy is made
at the next decode, so a stream a pending copy involves is neither read nor written until then; a range copy
across streams (which would abort llama.cpp) is refused. The engine: cache on equals cache off (near-tie rule)
with every source split can serve (A, S copied between streams, H restored into the slot's stream); a shared
prefix is reported cached; owners and the host tier keep to their budgets; a cancelled request and a restart in
the other layout leave no cell or file behind, and disk KV written in one layout restores in the other.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.cores import model_threads
from tests.server.cache.engine_harness import (
    chat_tokens,
    compare,
    generate,
    generate_many,
    reset_kv,
    used_cells,
)
from tests.server.conftest import embedded_model_available
from tests.server.near_tie import FIRST_TOKEN_PARTING_RATE, parting_bound

pytestmark = pytest.mark.model

SYSTEM = ("You are the assistant of an edge maintenance team. You answer briefly, cite device ids, and never "
          "invent telemetry. Devices: pump-1, pump-2, compressor-7, fan-3. Shifts: day and night. Escalate "
          "safety issues to the shift lead before anything else, and log every action in the maintenance book.")
QUESTIONS = ["Which device failed last night?", "What does a rising vibration mean?", "List the devices.",
             "Who is on the night shift?", "Is fan-3 healthy?", "Summarise the last alarm."]


def _skip_without_model() -> None:
    why = embedded_model_available()
    if why:
        pytest.skip(why)


def load(**overrides):
    _skip_without_model()
    from server import bootstrap
    from server.settings import ServerSettings

    kw = dict(parallel=3, ctx_size=3 * 1024, batch_size=256, threads=model_threads(), cache_min_tokens=16,
              resident_cells=2048, cache_tiers=("A", "S", "H"), kv_layout="split", spec_type="none",
              cache_route="longest")
    kw.update(overrides)
    return bootstrap.load(ServerSettings(**kw))


def split_kept_cells(model) -> int:
    """Cells the bookkeeping says the split layout holds: each slot's tokens and each owner's copy (no sharing)."""
    held = sum(len(s.tokens) for s in model.slots.slots)
    if model.router is not None and model.router.resident is not None:
        held += sum(len(o.tokens) for o in model.router.resident.owners)
    return held


@pytest.fixture(scope="module")
def reference():
    """Cache off, unified, no drafting: the answers the split layout must reproduce."""
    model = load(no_cache=True, parallel=2, kv_layout="unified")
    yield model
    model.close()


# ---------------------------------------------------------------------------------------------- the runtime
@pytest.fixture(scope="module")
def runtime():
    _skip_without_model()
    from server.engine.llama_runtime import LlamaRuntime, RuntimeConfig
    from server.model_file import embedded_model_path

    rt = LlamaRuntime(RuntimeConfig(embedded_model_path(), n_ctx=3 * 512, n_batch=256, n_seq_max=3,
                                    n_threads=model_threads(), n_threads_batch=model_threads(), kv_unified=False))
    yield rt
    rt.close()


def _prefill(rt, seq: int, tokens: list[int]) -> None:
    from server.engine.llama_runtime import BatchEntry

    rt.decode([BatchEntry(t, i, seq, i == len(tokens) - 1) for i, t in enumerate(tokens)])


def _one(rt, seq: int, token: int, pos: int) -> np.ndarray:
    from server.engine.llama_runtime import BatchEntry

    rt.decode([BatchEntry(token, pos, seq, True)])
    return np.array(rt.logits_matrix(1)[0])


def test_the_runtime_is_split_with_paging_off_and_why(runtime):
    assert runtime.split and runtime.n_stream == 3 and runtime.n_ctx_seq == 512
    assert not runtime.paged_attn.enabled and "split KV layout" in runtime.paged_attn.note


def test_a_copied_prefix_gives_the_sources_logits_bit_for_bit(runtime):
    rt = runtime
    tokens = chat_tokens(type("M", (), {"runtime": rt}), SYSTEM, QUESTIONS[0])
    n = len(tokens)
    for seq in range(3):
        rt.seq_rm(seq, -1, -1)
    _prefill(rt, 0, tokens[:-1])
    want = _one(rt, 0, tokens[-1], n - 1)
    rt.copy_prefix(0, 1, n - 1)  # seq 0 holds n; the copy is trimmed to n - 1
    assert (rt.seq_pos_min(1), rt.seq_pos_max(1)) == (0, n - 2)
    assert rt.copy_pending(0) and rt.copy_pending(1)
    got = _one(rt, 1, tokens[-1], n - 1)  # the copy is made by this decode, before its batch
    assert not rt.copy_pending(1)
    assert np.array_equal(got, want)
    for seq in range(3):
        rt.seq_rm(seq, -1, -1)


def test_a_stream_a_pending_copy_involves_is_read_or_written_once_the_copy_is_made(runtime):
    from server.cache.kv_format import parse_seq_state

    rt = runtime
    tokens = rt.tokenize("The pump failed at night.", add_special=True, parse_special=False)
    other = rt.tokenize("Fan three is fine.", add_special=True, parse_special=False)
    _prefill(rt, 0, tokens)
    blob = bytes(rt.state_seq_get(0))
    with pytest.raises(ValueError, match="whole streams"):
        rt.seq_cp(0, 1, 0, 3)  # llama.cpp would abort the process
    rt.copy_prefix(0, 1, len(tokens))
    assert len(rt.state_seq_get(0)) == len(blob) and rt.copy_pending(1)  # a copy's source is read as it is
    early = rt.copies_made_early
    copied = parse_seq_state(rt.state_seq_get(1))  # its cells arrive first (a decode past its end, removed)
    assert rt.copies_made_early == early + 1 and not rt.copy_pending(1)
    assert (rt.seq_pos_min(1), rt.seq_pos_max(1)) == (0, len(tokens) - 1)
    assert all(np.array_equal(a, b) for a, b in zip(copied.arrays(), parse_seq_state(blob).arrays()))
    # a restore into a stream a pending copy reads from: the copy takes what was there before
    _prefill(rt, 2, other)
    theirs = bytes(rt.state_seq_get(2))
    rt.copy_prefix(0, 1, len(tokens))
    assert rt.state_seq_set(theirs, 0)
    assert rt.copies_made_early == early + 2
    again = parse_seq_state(rt.state_seq_get(1))
    assert all(np.array_equal(a, b) for a, b in zip(again.arrays(), parse_seq_state(blob).arrays()))
    for seq in range(3):
        rt.seq_rm(seq, -1, -1)


def test_the_copy_is_timed_on_empty_streams_and_leaves_them_empty(runtime):
    ms = runtime.time_stream_copy(0, 1, repeats=1)
    assert ms >= 0.0
    assert runtime.seq_pos_max(0) == runtime.seq_pos_max(1) == -1 and not runtime.copy_pending(1)


# ----------------------------------------------------------------------------------------------- the engine
def prompts(model, n: int) -> list[list[int]]:
    systems = [SYSTEM, SYSTEM + " Report in French.", "You are a financial research assistant. Answer in one line."]
    return [chat_tokens(model, systems[i % 3], " Then: ".join(QUESTIONS[i % 6: i % 6 + 1 + i % 2])) for i in range(n)]


def check_rows(rows) -> None:
    problems = [r.problem for r in rows if r.problem]
    parted = sum(r.parting is not None for r in rows)
    assert not problems, problems
    assert parted <= parting_bound(len(rows)), f"{parted}/{len(rows)} part"
    assert sum(r.first_token_parts for r in rows) <= parting_bound(len(rows), FIRST_TOKEN_PARTING_RATE)


def test_split_cache_on_matches_cache_off_from_every_source(reference):
    model = load()
    try:
        assert model.runtime.split and model.kv_layout.layout == "split"
        assert model.seq_ids.layout.scratch == 0 and model.seq_ids.layout.parked == 0
        assert model.seq_ids.layout.owners == 2  # --resident-cells 2048 pays for two streams of 1024 cells
        ps = prompts(model, 12)
        want = [generate(reference, p, 6) for p in ps]
        rows = []
        # concurrently (S: copies from running slots and owners), then again after every device copy went to host (H)
        for batch in (ps[:3], ps[3:6], ps[6:9], ps[9:12]):
            got = generate_many(model, batch, 6)
            rows += [compare(g, want[ps.index(p)], model.runtime.is_eog) for g, p in zip(got, batch)]
        reset_kv(model)
        assert used_cells(model) == 0
        for p in ps[:6]:
            rows.append(compare(generate(model, p, 6), want[ps.index(p)], model.runtime.is_eog))
        check_rows(rows)
        sources = {r.source for r in rows}
        assert {"S", "H"} <= sources, sources
        assert used_cells(model) == split_kept_cells(model)
        assert model.router.fallbacks == 0
    finally:
        model.close()


def test_a_shared_prefix_is_reported_cached_in_the_split_layout():
    model = load(cache_tiers=("A", "S"))
    try:
        long_system = SYSTEM + " " + " ".join(f"Device {i} is in hall {i % 4}." for i in range(30))
        first, second = (chat_tokens(model, long_system, q) for q in QUESTIONS[:2])
        shared = next(i for i, (a, b) in enumerate(zip(first, second)) if a != b)
        a, b = generate_many(model, [first, second], 4)
        reports = sorted((r.final.cache for r in (a, b)), key=lambda c: c.reused_tokens)
        assert reports[0].reused_tokens == 0  # one computed the prefix...
        assert reports[1].source == "S" and reports[1].reused_tokens >= shared - 1  # ...the other copied it
        assert max(r.final.cached_tokens for r in (a, b)) == reports[1].reused_tokens
    finally:
        model.close()


def test_owners_and_the_host_tier_keep_to_their_budgets_in_the_split_layout():
    from server.cache.lifecycle import CacheHint

    model = load(resident_cells=2048, cache_ram=4)
    try:
        host = model.router.host
        for i, p in enumerate(prompts(model, 9)):  # pinned: each request's prefix is published as an owner
            generate(model, p, 2, hint=CacheHint(session=f"s{i}", pin=True))
            resident = model.router.resident
            assert resident.cells() <= resident.budget_cells
            assert len(resident.owners) <= model.seq_ids.layout.owners == 2
            stats = host.stats()
            assert stats["held_bytes"] <= stats["budget_bytes"] == 4 * 1024 * 1024
        assert used_cells(model) == split_kept_cells(model)
    finally:
        model.close()


def test_a_cancelled_request_leaves_no_cell_behind():
    from server.engine.sampling_params import SamplingParams
    from server.engine.sequence import Finished, GenerationRequest

    model = load()
    try:
        base = prompts(model, 1)[0]
        generate(model, base, 2)
        long_prompt = base + model.runtime.tokenize(" pump" * 600, add_special=False, parse_special=False)
        done = threading.Event()
        seq = model.engine.submit(GenerationRequest(prompt_tokens=long_prompt, sampling=SamplingParams(temperature=0),
                                                    max_tokens=64),
                                  lambda ev: done.set() if isinstance(ev, Finished) else None)
        time.sleep(0.5)  # into its prefill
        model.engine.cancel(seq)
        assert done.wait(120)
        assert used_cells(model) == split_kept_cells(model)
        assert all(model.seq_ids.in_use(kind) == 0 for kind in ("scratch", "parked"))
        assert generate(model, base, 2).final.cache.reused_tokens > 0
    finally:
        model.close()


def test_disk_kv_restores_across_a_layout_switch_and_restart(reference, tmp_path: Path):
    """Written by a unified server, read by a split one after a restart, and back: segments are layout-free."""
    kv_dir = tmp_path / "kv"
    ps = prompts(model=reference, n=3)
    want = [generate(reference, p, 6) for p in ps]
    for layout, other in (("unified", "split"), ("split", "unified")):
        writer = load(kv_layout=layout, cache_tiers=("A", "H", "D"), cache_dir=kv_dir)
        try:
            for p in ps:
                generate(writer, p, 6)
            reset_kv(writer)  # every slot's KV to host and disk
        finally:
            writer.close()
        reader = load(kv_layout=other, cache_tiers=("A", "D"), cache_dir=kv_dir)
        try:
            disk = reader.router.disk.stats()
            assert disk["corrupt_files"] == disk["foreign_files"] == 0 and disk["entries"] > 0
            rows = [compare(generate(reader, p, 6), w, reader.runtime.is_eog) for p, w in zip(ps, want)]
            check_rows(rows)
            assert {r.source for r in rows} == {"D"}, rows
            kept = split_kept_cells(reader) if reader.runtime.split else sum(len(s.tokens) for s in reader.slots.slots)
            assert used_cells(reader) == kept
        finally:
            reader.close()


def test_a_split_layout_the_model_cannot_take_refuses_to_start(tmp_path: Path):
    _skip_without_model()
    from harness.models import synth_swa_hybrid as synth
    from server.engine.kv_layout import KVLayoutUnavailable

    path = synth.write_swa_model(tmp_path / "swa.gguf", size="tiny")
    with pytest.raises(KVLayoutUnavailable, match="--kv-layout split"):
        load(model=path, kv_layout="split", parallel=2, ctx_size=1024)
    auto = load(model=path, kv_layout="auto", parallel=2, ctx_size=1024)
    try:
        assert auto.kv_layout.layout == "unified"
    finally:
        auto.close()


def test_the_server_says_which_layout_and_why_and_reports_cached_prefixes(tmp_path: Path):
    import httpx

    from tests.server.conftest import start_server, stop_server

    server = start_server(tmp_path, "--kv-layout", "split", "--parallel", "2", "--ctx-size", "2048",
                          "--spec-type", "none")
    try:
        props = httpx.get(server.base_url + "/props", timeout=30).json()["arbor"]
        layout = props["kv_layout"]
        # two slot streams and the two owner streams the default --resident-cells (2048) pays for
        assert (layout["layout"], layout["asked"], layout["streams"], layout["stream_cells"]) == ("split", "split",
                                                                                                   4, 1024)
        assert layout["reason"] and any("parked write-back is off" in n for n in layout["notes"])
        assert props["kv_unified"] is False and props["max_request_tokens"] == 1024
        assert props["paged_attention"]["enabled"] is False and "split" in props["paged_attention"]["note"]
        cached = []
        for question in QUESTIONS[:2]:
            body = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
                    "max_tokens": 4, "temperature": 0}
            answer = httpx.post(server.v1 + "/chat/completions", json=body, timeout=120).json()
            cached.append(answer["usage"]["prompt_tokens_details"]["cached_tokens"])
        assert cached[0] == 0 and cached[1] > 40, cached
        stats = httpx.get(server.base_url + "/cache/stats?measure=true", timeout=60).json()
        assert stats["kv"]["layout"] == "split" and stats["kv"]["used_cells"] == stats["kv"]["union_bound"]
    finally:
        stop_server(server)
