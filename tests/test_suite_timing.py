"""tests/suite_timing.py on a small throwaway suite: the slowest files are listed at the end of the
run, with the wall time; past ARBOR_SUITE_WARN_MINUTES a warning names them; ARBOR_TEST_TIMES gets
the per-file figures, in one process and under pytest-xdist; bench.test_durations renders them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

SLOW = '''
import time

import pytest

@pytest.fixture(scope="module")
def server():
    time.sleep(0.4)  # a module's server start: charged to this file
    yield

def test_one(server):
    time.sleep(0.2)

def test_two(server):
    pass
'''
FAST = '''
def test_fast():
    pass
'''


def run_suite(tmp_path: Path, env: dict[str, str], extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    (tmp_path / "test_slow.py").write_text(SLOW)
    (tmp_path / "test_fast.py").write_text(FAST)
    full = {k: v for k, v in os.environ.items() if k not in ("CI", "ARBOR_SUITE_WARN_MINUTES", "ARBOR_TEST_TIMES")}
    full |= {"PYTHONPATH": str(REPO), **env}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-q", "-p", "no:cacheprovider",
                           "-o", "addopts=", *extra, str(tmp_path)], cwd=tmp_path, env=full,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("extra", [(), ("-n", "2", "--dist", "loadfile")], ids=["one process", "xdist"])
def test_the_slowest_files_and_their_figures(tmp_path, extra):
    if extra:
        pytest.importorskip("xdist", reason="pytest-xdist is not installed (pip install -e '.[dev]')")
    times = tmp_path / "times.json"
    done = run_suite(tmp_path, {"ARBOR_TEST_TIMES": str(times)}, extra)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "slowest test files" in out and "WARNING" not in out, out
    listed = [line for line in out.splitlines() if line.strip().endswith(".py") and "tests" in line]
    assert "test_slow.py" in listed[0] and "test_fast.py" in listed[1], out  # slowest first
    assert out.splitlines()[-1].startswith("3 passed"), out  # pytest's own closing line stays last

    data = json.loads(times.read_text())
    assert data["workers"] == (2 if extra else 1)
    slow, fast = (next(v for k, v in data["files"].items() if k.endswith(name)) for name in ("test_slow.py",
                                                                                              "test_fast.py"))
    assert slow["tests"] == 2 and fast["tests"] == 1
    assert slow["seconds"] >= 0.6 > fast["seconds"]  # the module fixture's 0.4 s counts for its file
    assert slow["slowest_test"].endswith("test_one") and slow["slowest_test_s"] >= 0.6
    assert data["wall_s"] >= 0.6


def test_past_the_limit_a_warning_names_the_slowest_files(tmp_path):
    done = run_suite(tmp_path, {"ARBOR_SUITE_WARN_MINUTES": "0"})
    assert done.returncode == 0, done.stdout
    warning = next(line for line in done.stdout.splitlines() if line.startswith("WARNING"))
    assert "over 0" in warning and "test_slow.py" in warning, warning


def test_bench_renders_the_table(tmp_path):
    from bench.test_durations import main

    times = tmp_path / "times.json"
    assert run_suite(tmp_path, {"ARBOR_TEST_TIMES": str(times)}).returncode == 0
    out = tmp_path / "durations.md"
    assert main(["--from", str(times), "--command", "make test", "--out", str(out)]) == 0
    text = out.read_text()
    assert "`make test`" in text and "for 3 tests in 2 files" in text
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert "test_slow.py" in rows[0] and "`test_one`" in rows[0] and "test_fast.py" in rows[1]

    # an earlier run beside it: its wall time, and its seconds per file in a column of their own
    earlier = json.loads(times.read_text())
    earlier["wall_s"] *= 2
    earlier["files"] = {k: {**v, "seconds": 9.5} for k, v in earlier["files"].items()}
    (tmp_path / "before.json").write_text(json.dumps(earlier))
    assert main(["--from", str(times), "--before", str(tmp_path / "before.json"), "--before-label", "one process",
                 "--out", str(out)]) == 0
    text = out.read_text()
    assert "Before (one process)" in text and "(2.00x this run's)" in text
    assert all(line.endswith(" 9.5 |") for line in text.splitlines() if line.startswith("| `")), text

