"""Loopback ports for the servers the tests and benchmarks start, without two processes of one
run being handed the same port.

Asking the kernel for a free port (`bind(("127.0.0.1", 0))`, then closing the socket) races:
between the close and the server's own bind, another pytest-xdist worker asking the same way
can be handed the same port. One of the two servers then fails to bind, while the health check
of its starter already sees the other one answering, and the test talks to a server of another
test (CI saw a workbench answer 404 "unknown session" for a session it never had).

So each process draws ports from a block of its own, below the kernel's ephemeral range (which
the kernel uses for `bind(0)` and for outgoing connections): an xdist worker `gwN` takes block
N, any other process a block chosen by its pid. Inside its block a process walks from an
offset derived from its pid (a subprocess of a worker inherits the worker's block, not its
place in it) and skips every port it cannot bind now, and the ports browsers refuse to load
(`BROWSER_UNSAFE`: Chromium answers ERR_UNSAFE_PORT, which failed a browser test on CI).
"""

from __future__ import annotations

import os
import socket
import threading

BLOCK = 400  # ports per block
FIRST = 10_000  # the blocks lie in [FIRST, FIRST + BLOCKS * BLOCK): below 32768, Linux's default ephemeral start
BLOCKS = 50
WORKER_BLOCKS = 32  # blocks 0..31 are xdist workers gw0..gw31; other processes share the rest by pid
# Chromium's and Firefox's restricted ports inside the blocks (their lists stop at 10080 above 6697)
BROWSER_UNSAFE = frozenset({10080})

_lock = threading.Lock()
_cursor: int | None = None


def _block() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit() and int(worker[2:]) < WORKER_BLOCKS:
        return int(worker[2:])
    return WORKER_BLOCKS + os.getpid() % (BLOCKS - WORKER_BLOCKS)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now and that no other process of this test run or
    benchmark is handed by this function (see the module's docstring); also handy as a port
    nothing listens on. Raises RuntimeError when the whole block is taken."""
    global _cursor
    start = FIRST + _block() * BLOCK
    with _lock:
        if _cursor is None:
            _cursor = (os.getpid() * 97) % BLOCK
        for _ in range(BLOCK):
            port = start + _cursor
            _cursor = (_cursor + 1) % BLOCK
            if port not in BROWSER_UNSAFE and _bindable(port):
                return port
    raise RuntimeError(f"no free loopback port in [{start}, {start + BLOCK})")
