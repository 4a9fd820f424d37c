"""Replay and benchmarks: manifests, workload generators, the replay runner, comparisons."""
