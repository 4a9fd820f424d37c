"""``arbor replay``: the workbench's command over the benchmark harness (harness/: manifests,
workload generators, the replay runner, results and comparisons), the recording proxy that
captures a client's session as a manifest, the workbench's own workloads, and the results files
the Replay page lists."""
