"""How many llama.cpp threads a test's model may use (issue 37).

The suite runs its files in several pytest-xdist processes (scripts/test.sh); each real-model
test then shares the machine's cores with the others. ggml's compute threads meet at a barrier
after every op and spin while they wait, so two models of a thread per core each would put
twice as many spinning threads as cores on the machine. Each process therefore gets its even
share of the physical cores, at least one thread. tests/conftest.py exports the figure as ARBOR_SERVER_THREADS, so every
arbor-server a test starts without `--threads` uses it too.
"""

from __future__ import annotations

import os

from server.settings import physical_cores


def suite_processes() -> int:
    """The number of pytest processes running the suite now (1 without xdist)."""
    try:
        return max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    except ValueError:
        return 1


def model_threads() -> int:
    """Threads for one real model in this test process: its share of the physical cores."""
    return max(1, physical_cores() // suite_processes())
