"""The container entrypoint, generated from the Dockerfile's own RUN line and run here."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.deploy.deploy_files import parse_dockerfile

ENTRYPOINT = "/usr/local/bin/arbor-entrypoint"


@pytest.fixture(scope="module")
def entrypoint(tmp_path_factory):
    _, stages = parse_dockerfile()
    run = next(" ".join(i.value) for i in stages["files"].of("RUN") if ENTRYPOINT in " ".join(i.value))
    path = tmp_path_factory.mktemp("entry") / "arbor-entrypoint"
    subprocess.run([shutil.which("bash"), "-c", run.replace(ENTRYPOINT, str(path))], check=True)
    for target in ("server-cpu", "server-cuda", "server-cann", "workbench"):
        assert stages[target].of("ENTRYPOINT")[0].value == (ENTRYPOINT,)
    return path


def run(entrypoint, *command, env=None):
    return subprocess.run([str(entrypoint), *command], capture_output=True, text=True, env=env, timeout=60)


def test_runs_the_command_and_keeps_its_exit_status(entrypoint):
    done = run(entrypoint, "sh", "-c", "echo hello; exit 3", env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 3
    assert done.stdout == "hello\n"


def test_copies_output_to_the_log_file(entrypoint, tmp_path):
    log = tmp_path / "logs" / "server.log"
    env = {"PATH": "/usr/bin:/bin", "ARBOR_LOG_FILE": str(log)}
    first = run(entrypoint, "sh", "-c", "echo out; echo err >&2", env=env)
    second = run(entrypoint, "sh", "-c", "echo again", env=env)
    assert first.returncode == 0 and second.returncode == 0
    assert "out" in first.stdout and "err" in first.stdout  # still visible to `docker compose logs`
    assert sorted(log.read_text().split()) == ["again", "err", "out"]  # appended, both streams


def test_loads_the_environment_script(entrypoint, tmp_path):
    script = tmp_path / "set_env.sh"
    script.write_text("export ASCEND_TOOLKIT_HOME=/opt/fake-cann\n")
    done = run(entrypoint, "sh", "-c", 'echo "$ASCEND_TOOLKIT_HOME"',
               env={"PATH": "/usr/bin:/bin", "ARBOR_ENV_SCRIPT": str(script)})
    assert done.stdout.strip() == "/opt/fake-cann"


def test_missing_environment_script_is_a_clear_error(entrypoint, tmp_path):
    done = run(entrypoint, "true", env={"PATH": "/usr/bin:/bin", "ARBOR_ENV_SCRIPT": str(tmp_path / "none.sh")})
    assert done.returncode != 0
    assert "cannot load" in done.stderr
