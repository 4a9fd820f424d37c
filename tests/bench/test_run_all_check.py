"""bench.run_all's check against `--no-cache` (no server: the index's runs by hand)."""

from bench.run_all import no_cache_checks


def run(workload, config, rnd, wall):
    return {"workload": workload, "config": config, "round": rnd, "wall_s": wall}


def test_ratios_are_per_round_and_the_median_is_flagged_above_the_noise():
    runs = [run("unique", "arbor --no-cache", 1, 1.0), run("unique", "arbor A,S,H", 1, 1.2),
            run("unique", "arbor --no-cache", 2, 2.0), run("unique", "arbor A,S,H", 2, 2.2),
            run("unique", "arbor --no-cache", 3, 1.0), run("unique", "arbor A,S,H", 3, 0.9)]
    (check,) = no_cache_checks(runs, noise_floor=0.05)
    assert check["wall_ratios"] == [1.2, 1.1, 0.9] and check["median"] == 1.1
    assert check["noise"] == 1.0 and not check["slower"]  # the baseline itself moved 2x between rounds


def test_one_round_uses_the_noise_floor():
    runs = [run("w", "arbor --no-cache", 1, 1.0), run("w", "arbor A", 1, 1.06), run("w", "arbor A,S", 1, 1.04)]
    checks = {c["config"]: c for c in no_cache_checks(runs, noise_floor=0.05)}
    assert checks["arbor A"]["slower"] and not checks["arbor A,S"]["slower"]


def test_a_workload_without_a_baseline_or_old_runs_without_walls_are_left_out():
    assert no_cache_checks([run("w", "arbor A", 1, 1.0), {"workload": "v", "config": "arbor --no-cache"}]) == []
