"""cluster_bench's logic without servers: the configurations it plans, the llama-server flags,
the shared tier's counters and the summary row."""

import pytest

from bench.cluster_bench import CONFIGS, LLAMA, SHARED, _summary, llama_args, plan, shared_counters, table
from bench.cluster_sessions import SessionRun, Turn


def test_plan_all_five():
    cfgs = plan(CONFIGS)
    assert [c.name for c in cfgs] == list(CONFIGS)
    by = {c.name: c for c in cfgs}
    assert by[SHARED].shared and by[SHARED].policy == "cache_aware" and by[SHARED].replicas == 2
    assert not by["cache_aware"].shared
    assert by["round_robin"].policy == "round_robin"
    assert by["one replica"].replicas == 1 and by["one replica"].policy is None
    assert by[LLAMA].llama and by[LLAMA].policy == "cache_aware" and by[LLAMA].computed_source == "timings"
    assert all(c.computed_source == "usage" for c in cfgs if not c.llama)
    with pytest.raises(ValueError):
        plan(["cache_aware", "nope"])


def test_llama_args_match_the_replicas():
    args = llama_args(1)
    assert args[args.index("-np") + 1] == "4" and args[args.index("-c") + 1] == "8192"
    assert args[args.index("-t") + 1] == "1"
    assert "--kv-unified" in args and "--metrics" in args  # one KV as arbor's; SMG polls /metrics
    assert args[args.index("--alias") + 1] == "arbor-bench"  # SMG routes by model id


def test_shared_counters_sum_the_replicas():
    stats = [{"tiers": {"R": {"lookups": 5, "hits": 2, "stored_chunks": 10, "errors": 0}}},
             {"tiers": {"R": {"lookups": 3, "hits": 1, "stored_chunks": 4, "errors": 1}}}, {}]
    out = shared_counters(stats)
    assert out["lookups"] == 8 and out["hits"] == 3 and out["stored_chunks"] == 14 and out["errors"] == 1
    assert out["rejected"] == 0


def test_summary_row_and_table():
    run = SessionRun([Turn("a", 0, 200, "r1", 100, 0, prompt_ms=50.0, prompt_n=100),
                      Turn("a", 1, 200, "r1", 150, 100, prompt_ms=10.0, prompt_n=60),
                      Turn("b", 0, 200, "r2", 100, 0, prompt_ms=40.0, prompt_n=100)])
    row = _summary("x", run, 12.34, ideal=200, source="timings")
    assert row["computed"] == 260 and row["computed_usage"] == 250 and row["computed_over_ideal"] == 1.3
    assert row["prompt_tokens"] == 350 and row["sessions_per_replica"] == [1, 1] and row["min_affinity"] == 1.0
    assert row["wall_s"] == 12.3
    assert "| x | 12.3 |" in table([row])
