"""The benchmarks' entry points: ``python -m bench.<name>`` runs each benchmark (and
``bench.report``, ``bench.test_durations``, which write docs/benchmarks.md and
docs/test-durations.md). What they share (servers as processes, the SSE parser, the
streamed-request client, workloads, the replay runner, synthetic models, kernel checks) is the
library in harness/; a few entry points here (synth_model, family_model, synth_mla,
synth_swa_hybrid, fa_kernel, paged_kernel_check) only run a command of it."""
