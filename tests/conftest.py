"""Suite-wide rule: under CI (CI=true, as .ci/run sets it) a skipped test is a failed test.

CI must not go green by skipping. Every skip in this suite means something is missing (a test
tool, llama-cpp-python, the embedded model), and scripts/setup.sh installs all of it, so under
CI a skip can only mean a broken setup. There is no allow-list: no skip reason is legitimate in
CI today; a test that must not run in CI should be deselected by marker, not skipped. xfail is
not a skip and is left alone. Outside CI skips stay skips, so a partial developer setup still
runs what it can.
"""

from __future__ import annotations

import os

import pytest

from tests.cores import model_threads

# Every run ends with the slowest test files and a warning past 45 minutes (tests/suite_timing.py).
from tests.suite_timing import (  # noqa: F401  (hooks: pytest finds them in this module)
    pytest_runtest_logreport,
    pytest_sessionstart,
    pytest_terminal_summary,
)
from tests.workbench_auth import TEST_HOSTS, WORKBENCH_TOKEN


def pytest_configure(config):
    """Each pytest process's models get its share of the cores (tests/cores.py): every arbor-server
    a test starts without --threads reads ARBOR_SERVER_THREADS. Not set by an xdist controller, which
    runs no test and whose environment its workers inherit."""
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        os.environ.setdefault("ARBOR_SERVER_THREADS", str(model_threads()))
    # Every workbench a test starts, in this process or as `arbor serve`, signs callers in with
    # the suite's token (tests/workbench_auth.py); the tests of sign-in itself set their own.
    os.environ.setdefault("ARBOR_WORKBENCH_TOKEN", WORKBENCH_TOKEN)
    os.environ.setdefault("ARBOR_ALLOWED_HOSTS", TEST_HOSTS)


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def _reason(longrepr) -> str:
    # A skip's longrepr is (path, line, "Skipped: why").
    return longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)


def _fail_skip(report) -> None:
    if in_ci() and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = (f"skipped under CI=true, which counts as a failure: {_reason(report.longrepr)}\n"
                           "Install what is missing (scripts/setup.sh --test-tools does it all).")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_skip(outcome.get_result())
