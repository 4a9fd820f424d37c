"""Where the suite's time goes, printed at the end of every run (issue 37).

CI lands nothing when `.ci/run` passes 90 minutes, and the suite only grows, so every run ends
with the test files that took longest (setup, call and teardown of their tests added up: a
module's server start counts for the file that pays it) and the session's wall time. When the
tests alone pass ``ARBOR_SUITE_WARN_MINUTES`` (default 45, half of CI's limit) a warning names
the slowest files: a warning, not a failure, since the limit is what fails.

With ``ARBOR_TEST_TIMES=path.json`` the per-file figures are also written out, for
``python -m bench.test_durations`` to turn into docs/test-durations.md.

The hooks are imported by tests/conftest.py. Under pytest-xdist they run on the controller, which
receives every worker's reports; workers write nothing.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

WARN_MINUTES_DEFAULT = 45.0
SHOWN_FILES = 15


@dataclass
class FileTime:
    """One test file's share of the run: seconds summed over its tests' phases."""

    seconds: float = 0.0
    tests: int = 0
    slowest_test: str = ""
    slowest_test_s: float = 0.0


@dataclass
class SuiteTimes:
    """Per-file durations collected from test reports, and the session's wall-clock start."""

    started: float = field(default_factory=time.monotonic)
    files: dict[str, FileTime] = field(default_factory=dict)
    _per_test: dict[str, float] = field(default_factory=dict)

    def add(self, nodeid: str, when: str, duration: float) -> None:
        path = nodeid.split("::", 1)[0]
        entry = self.files.setdefault(path, FileTime())
        entry.seconds += duration
        if when == "call":
            entry.tests += 1
        total = self._per_test.get(nodeid, 0.0) + duration
        self._per_test[nodeid] = total
        if total > entry.slowest_test_s:
            entry.slowest_test, entry.slowest_test_s = nodeid, total

    def wall_s(self) -> float:
        return time.monotonic() - self.started

    def test_s(self) -> float:
        return sum(f.seconds for f in self.files.values())

    def ranked(self) -> list[tuple[str, FileTime]]:
        return sorted(self.files.items(), key=lambda kv: kv[1].seconds, reverse=True)

    def as_json(self, workers: int, wall_s: float) -> dict:
        return {"wall_s": round(wall_s, 1), "workers": workers, "test_s": round(self.test_s(), 1),
                "files": {path: {"seconds": round(f.seconds, 2), "tests": f.tests,
                                 "slowest_test": f.slowest_test, "slowest_test_s": round(f.slowest_test_s, 2)}
                          for path, f in self.ranked()}}


def warn_minutes() -> float:
    raw = os.environ.get("ARBOR_SUITE_WARN_MINUTES", "")
    try:
        return float(raw) if raw.strip() else WARN_MINUTES_DEFAULT
    except ValueError:
        return WARN_MINUTES_DEFAULT


# The session's collector: pytest_runtest_logreport gets no config to find it on.
_times: SuiteTimes | None = None


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _workers(config: pytest.Config) -> int:
    numprocesses = getattr(config.option, "numprocesses", None)
    return int(numprocesses) if isinstance(numprocesses, int) and numprocesses > 0 else 1


def pytest_sessionstart(session: pytest.Session) -> None:
    global _times
    _times = SuiteTimes()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _times is not None:
        _times.add(report.nodeid, report.when, report.duration)


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    if _is_worker(config):
        return
    times = _times
    if times is None or not times.files:
        return
    wall = times.wall_s()
    workers = _workers(config)
    tr = terminalreporter
    tr.write_sep("=", "slowest test files (setup + call + teardown)")
    for path, entry in times.ranked()[:SHOWN_FILES]:
        tr.write_line(f"{entry.seconds:8.1f}s  {entry.tests:4d} tests  {path}")
    tr.write_line(f"tests took {wall / 60:.1f} min wall ({times.test_s() / 60:.1f} min of test time in {workers} "
                  f"process{'es' if workers > 1 else ''})")
    limit = warn_minutes()
    if wall > limit * 60:
        slowest = ", ".join(f"{path} ({entry.seconds / 60:.1f} min)" for path, entry in times.ranked()[:5])
        tr.write_line(f"WARNING: the tests alone took {wall / 60:.1f} min, over {limit:g} (CI stops at 90 min "
                      f"with set-up included); the slowest files: {slowest}", yellow=True, bold=True)
    out = os.environ.get("ARBOR_TEST_TIMES", "").strip()
    if out:
        Path(out).write_text(json.dumps(times.as_json(workers, wall), indent=1) + "\n")
