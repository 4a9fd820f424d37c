"""The benchmark harness: what Arbor's benchmarks, its tests and the workbench's replay share.

One concern per sub-package:

- ``models/``: random-weight GGUF models of real architectures (the tests' model fixtures);
- ``kernels/``: ggml's flash-attention operator from Python (ctypes), and the checks of the
  paged kernels against the dense ones;
- ``serving/``: servers as processes, the one SSE parser, the one streamed-request client, and
  the runner that replays a manifest against a server;
- ``workloads/``: request manifests' workload generators, the shapes of the three APIs, the ideal;
- ``reports/``: replay results, their summary and comparisons.

``manifest.py`` is the request manifest format the workbench records and the replay reads.

The harness imports neither ``app`` nor ``server`` (it talks to a server over HTTP and to
llama.cpp's libraries through ctypes), so the workbench (``app/replay``) and the benchmarks'
entry points (``bench/``) both build on it; tests/test_import_direction.py keeps it so. Every
``__init__`` holds a docstring only: importing a sub-package costs nothing, so a host with only
numpy and gguf can still write a model (bench/device_prebuild.sh).
"""
