"""The container entrypoint, docker/entrypoint.sh, run here as every image runs it."""

from __future__ import annotations

import subprocess

import pytest

from tests.deploy.deploy_files import DOCKERFILES, ENTRYPOINT_SCRIPT, parse_dockerfile

ENTRYPOINT = "/usr/local/bin/arbor-entrypoint"


@pytest.fixture(scope="module")
def entrypoint():
    for name, path in DOCKERFILES.items():
        runtime = list(parse_dockerfile(path)[1].values())[-1]
        assert runtime.of("ENTRYPOINT")[0].value == (ENTRYPOINT,), name
        copies = [i.value for i in runtime.of("COPY") if not i.flags]
        assert ("docker/entrypoint.sh", ENTRYPOINT) in copies, f"{name} does not install docker/entrypoint.sh"
        assert f"chmod 0755 {ENTRYPOINT}" in runtime.text("RUN"), f"{name}: the checkout's file mode is not trusted"
    return ENTRYPOINT_SCRIPT


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
