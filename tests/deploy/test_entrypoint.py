"""The container entrypoint, docker/entrypoint.sh, run here as every image runs it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

import pytest

from tests.deploy.deploy_files import DOCKERFILES, ENTRYPOINT_SCRIPT, parse_dockerfile

ENTRYPOINT = "/usr/local/bin/arbor-entrypoint"
LOG_WRITER = "/opt/arbor/log_writer.py"  # where entrypoint.sh looks for it when it is not beside it


@pytest.fixture(scope="module")
def entrypoint():
    for name, path in DOCKERFILES.items():
        runtime = list(parse_dockerfile(path)[1].values())[-1]
        assert runtime.of("ENTRYPOINT")[0].value == (ENTRYPOINT,), name
        copies = [i.value for i in runtime.of("COPY") if not i.flags]
        assert ("docker/entrypoint.sh", ENTRYPOINT) in copies, f"{name} does not install docker/entrypoint.sh"
        assert f"chmod 0755 {ENTRYPOINT}" in runtime.text("RUN"), f"{name}: the checkout's file mode is not trusted"
        assert any("docker/log_writer.py" in copy[:-1] and copy[-1] in (LOG_WRITER, "/opt/arbor/")
                   for copy in copies), f"{name} does not install docker/log_writer.py as {LOG_WRITER}"
        assert f"chmod 0644 {LOG_WRITER}" in runtime.text("RUN"), \
            f"{name}: user 10001 must be able to read {LOG_WRITER}"
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


def test_rotates_the_log_file_and_keeps_a_failing_exit_status(entrypoint, tmp_path):
    log = tmp_path / "logs" / "server.log"
    env = {"PATH": "/usr/bin:/bin", "ARBOR_LOG_FILE": str(log),
           "ARBOR_LOG_MAX_MB": "0.001", "ARBOR_LOG_BACKUPS": "2"}  # 1048 bytes, 2 backups
    script = 'i=0; while [ $i -lt 200 ]; do echo "line $i of the service"; i=$((i+1)); done; echo "failed" >&2; exit 5'
    done = run(entrypoint, "sh", "-c", script, env=env)
    assert done.returncode == 5, done.stderr  # the service's own status, not the log writer's
    lines = done.stdout.splitlines()
    assert len(lines) == 201 and lines[-1] == "failed"  # `docker compose logs` still has all of it
    names = sorted(p.name for p in log.parent.iterdir())
    assert names == ["server.log", "server.log.1", "server.log.2"]
    assert all(p.stat().st_size <= 1048 for p in log.parent.iterdir())
    kept = "".join((log.parent / n).read_text() for n in ["server.log.2", "server.log.1", "server.log"])
    assert done.stdout.endswith(kept) and kept.endswith("line 199 of the service\nfailed\n")


def test_the_stop_signal_reaches_the_command_and_its_last_lines_are_logged(entrypoint, tmp_path):
    log = tmp_path / "logs" / "workbench.log"
    script = 'trap "echo stopping; exit 143" TERM; echo ready; while :; do sleep 0.05; done'
    proc = subprocess.Popen([str(entrypoint), "sh", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={"PATH": "/usr/bin:/bin", "ARBOR_LOG_FILE": str(log)})
    try:
        assert proc.stdout.readline() == b"ready\n"
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)  # its pid is the command's: the entrypoint exec'd it
        out, _ = proc.communicate(timeout=10)  # and the log writer ends with the command's output
    finally:
        proc.kill()
    assert proc.returncode == 143 and out == b"stopping\n"
    assert time.monotonic() - started < 5
    assert log.read_text() == "ready\nstopping\n"


def test_without_python3_it_appends_without_rotation(entrypoint, tmp_path):
    bin_dir = tmp_path / "bin"  # the tools the entrypoint needs, and no python3
    bin_dir.mkdir()
    for tool in ("sh", "tee", "mkdir", "dirname"):
        os.symlink(shutil.which(tool), bin_dir / tool)
    log = tmp_path / "logs" / "server.log"
    env = {"PATH": str(bin_dir), "ARBOR_LOG_FILE": str(log), "ARBOR_LOG_MAX_MB": "0.0001"}
    done = run(entrypoint, "sh", "-c", "echo one; echo two; exit 4", env=env)
    assert done.returncode == 4
    assert "without rotation" in done.stderr
    assert log.read_text() == "one\ntwo\n" and "one\ntwo\n" in done.stdout
