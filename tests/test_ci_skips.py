"""tests/conftest.py's rule, run on a small throwaway suite: under CI=true every kind of skip
fails the run with its reason; outside CI skips stay skips; xfail is untouched."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

SKIPS = '''
import pytest

def test_runs():
    pass

def test_skip_call():
    pytest.skip("chromium is missing")

@pytest.mark.skipif(True, reason="shellcheck is not installed")
def test_skipif():
    pass

@pytest.fixture
def needs_model():
    pytest.skip("llama-cpp-python is not installed")

def test_fixture_skip(needs_model):
    pass

@pytest.mark.xfail(reason="known bug", strict=True)
def test_xfail():
    assert False
'''
MODULE_SKIP = '''
import pytest
pytest.importorskip("no_such_module_anywhere")
'''


def run_suite(tmp_path: Path, ci: str | None, text: str = SKIPS,
              extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    (tmp_path / "test_suite.py").write_text(text)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = str(REPO)
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-q", "-rA", "-p",
                           "no:cacheprovider", "-o", "addopts=", *extra, str(tmp_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("ci", ["true", "1"])
def test_under_ci_every_skip_fails_with_its_reason(tmp_path, ci):
    done = run_suite(tmp_path, ci)
    out = done.stdout
    assert done.returncode == 1, out
    # A skip in the call fails the test; one in setup (skipif, a fixture) is an error.
    assert out.splitlines()[-1].startswith("1 failed, 1 passed, 1 xfailed, 2 errors"), out
    for reason in ("chromium is missing", "shellcheck is not installed", "llama-cpp-python is not installed"):
        assert reason in out, reason


def test_under_ci_every_skip_fails_in_parallel_processes_too(tmp_path):
    """scripts/test.sh runs the suite in pytest-xdist processes: the rule holds in each of them."""
    pytest.importorskip("xdist", reason="pytest-xdist is not installed (pip install -e '.[dev]')")
    done = run_suite(tmp_path, "true", extra=("-n", "2", "--dist", "loadfile"))
    assert done.returncode == 1, done.stdout
    assert done.stdout.splitlines()[-1].startswith("1 failed, 1 passed, 1 xfailed, 2 errors"), done.stdout
    assert "chromium is missing" in done.stdout and "shellcheck is not installed" in done.stdout


def test_under_ci_a_module_level_skip_is_a_collection_error(tmp_path):
    done = run_suite(tmp_path, "true", MODULE_SKIP)
    assert done.returncode == 2 and "1 error" in done.stdout, done.stdout
    assert "skipped under CI=true" in done.stdout and "no_such_module_anywhere" in done.stdout


@pytest.mark.parametrize("ci", [None, "false", ""])
def test_outside_ci_skips_stay_skips(tmp_path, ci):
    done = run_suite(tmp_path, ci)
    assert done.returncode == 0, done.stdout
    assert done.stdout.splitlines()[-1].startswith("1 passed, 3 skipped, 1 xfailed"), done.stdout
    assert run_suite(tmp_path, ci, MODULE_SKIP).returncode == 5  # all skipped at collection: no tests ran
