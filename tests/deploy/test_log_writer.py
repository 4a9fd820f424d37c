"""docker/log_writer.py: the entrypoint's copy of a service's output to stdout and a rotated file."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time

from tests.deploy.deploy_files import DOCKER_DIR

WRITER = DOCKER_DIR / "log_writer.py"
_spec = importlib.util.spec_from_file_location("arbor_log_writer", WRITER)
log_writer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(log_writer)


def files(path):
    """The log file and its backups that exist, newest first: {name: bytes}."""
    names = [path.name] + [f"{path.name}.{i}" for i in range(1, 10)]
    return {n: (path.parent / n).read_bytes() for n in names if (path.parent / n).exists()}


def oldest_first(path):
    return b"".join(reversed(list(files(path).values())))


def pump_bytes(tmp_path, data, max_bytes, backups, read_size=7):
    """Runs pump() with data as stdin (read read_size bytes at a time) and a file as stdout."""
    source, copy = tmp_path / "stdin", tmp_path / "stdout"
    source.write_bytes(data)
    log = tmp_path / "logs" / "server.log"
    log.parent.mkdir(exist_ok=True)
    with open(source, "rb") as inp, open(copy, "wb") as out:
        log_writer.pump(inp.fileno(), out.fileno(), log_writer.RotatingLog(str(log), max_bytes, backups), read_size)
    return log, copy.read_bytes()


def numbered(n, width=20):
    return b"".join(f"line {i:05d}".ljust(width - 1).encode() + b"\n" for i in range(n))


def test_rotates_at_the_size_and_keeps_the_backup_count(tmp_path):
    data = numbered(100)  # 2000 bytes of 20-byte lines
    log, copy = pump_bytes(tmp_path, data, max_bytes=210, backups=3)
    assert copy == data  # stdout gets everything, unchanged
    kept = files(log)
    assert list(kept) == ["server.log", "server.log.1", "server.log.2", "server.log.3"]
    assert all(len(body) <= 210 for body in kept.values())
    assert all(len(kept[f"server.log.{i}"]) == 200 for i in (1, 2, 3))  # 10 whole lines each, never split
    assert data.endswith(oldest_first(log))  # the newest lines, in order, none missing in between
    assert kept["server.log"].endswith(b"line 00099".ljust(19) + b"\n")


def test_rotation_appends_to_an_existing_file_and_counts_its_size(tmp_path):
    log = tmp_path / "logs" / "server.log"
    log.parent.mkdir()
    log.write_bytes(b"x" * 170 + b"\n")  # from the previous start
    writer = log_writer.RotatingLog(str(log), 200, 2)
    writer.write(b"a" * 40 + b"\n")  # 171 + 41 > 200: rolls over first
    writer.close()
    assert files(log) == {"server.log": b"a" * 40 + b"\n", "server.log.1": b"x" * 170 + b"\n"}
    writer = log_writer.RotatingLog(str(log), 200, 2)
    writer.write(b"b\n")
    writer.close()
    assert files(log)["server.log"] == b"a" * 40 + b"\nb\n"  # appended across restarts


def test_zero_backups_starts_the_file_over_and_zero_size_never_rotates(tmp_path):
    log, _ = pump_bytes(tmp_path, numbered(30), max_bytes=100, backups=0)
    assert list(files(log)) == ["server.log"] and len(files(log)["server.log"]) <= 100
    assert numbered(30).endswith(files(log)["server.log"])
    unbounded = tmp_path / "unbounded"
    unbounded.mkdir()
    log, _ = pump_bytes(unbounded, numbered(300), max_bytes=0, backups=3)
    assert files(log) == {"server.log": numbered(300)}


def test_invalid_utf8_nul_and_a_partial_last_line_are_kept_exactly(tmp_path):
    data = b"ok \xff\xfe\xc3(\n\x00\x01 binary\r\nprogress 10%\rprogress 100%\rno newline at the end \xe2\x82"
    log, copy = pump_bytes(tmp_path, data, max_bytes=1 << 20, backups=3, read_size=3)
    assert copy == data
    assert files(log)["server.log"] == data


def test_a_line_longer_than_a_file_is_cut_and_nothing_exceeds_the_size(tmp_path):
    data = b"short\n" + b"L" * 1000 + b"\n" + b"tail\n"
    log, copy = pump_bytes(tmp_path, data, max_bytes=300, backups=5, read_size=64)
    assert copy == data
    assert all(len(body) <= 300 for body in files(log).values())
    assert oldest_first(log) == data


def test_an_unwritable_file_does_not_stop_the_copy(tmp_path, capfd):
    log = tmp_path / "server.log"
    log.mkdir()  # a directory where the file should be: every open fails
    source, copy = tmp_path / "stdin", tmp_path / "stdout"
    source.write_bytes(numbered(50))
    with open(source, "rb") as inp, open(copy, "wb") as out:
        log_writer.pump(inp.fileno(), out.fileno(), log_writer.RotatingLog(str(log), 100, 2, retry_s=0), 16)
    assert copy.read_bytes() == numbered(50)
    assert capfd.readouterr().err.count("cannot write") == 1  # said once, not per line


def test_settings_come_from_the_environment_with_defaults(monkeypatch, capsys):
    monkeypatch.delenv("ARBOR_LOG_MAX_MB", raising=False)
    monkeypatch.delenv("ARBOR_LOG_BACKUPS", raising=False)
    assert log_writer.settings() == (20 * 1024 * 1024, 3)
    monkeypatch.setenv("ARBOR_LOG_MAX_MB", "0.5")
    monkeypatch.setenv("ARBOR_LOG_BACKUPS", "0")
    assert log_writer.settings() == (512 * 1024, 0)
    monkeypatch.setenv("ARBOR_LOG_MAX_MB", "lots")
    monkeypatch.setenv("ARBOR_LOG_BACKUPS", "-1")
    assert log_writer.settings() == (20 * 1024 * 1024, 3)


def start(tmp_path, env=None, **kwargs):
    log = tmp_path / "logs" / "workbench.log"
    log.parent.mkdir(exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-I", str(WRITER), str(log)], stdin=subprocess.PIPE,
                            stdout=kwargs.pop("stdout", subprocess.PIPE), stderr=subprocess.PIPE,
                            env={"PATH": os.environ["PATH"], **(env or {})}, **kwargs)
    return proc, log


def test_the_script_copies_to_stdout_flushes_each_line_and_exits_at_eof(tmp_path):
    proc, log = start(tmp_path, env={"ARBOR_LOG_MAX_MB": "0.0001", "ARBOR_LOG_BACKUPS": "1"})  # 104 bytes
    try:
        proc.stdin.write(b"first line\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == b"first line\n"  # copied at once
        deadline = time.monotonic() + 10
        while (not log.exists() or log.read_bytes() != b"first line\n") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert log.read_bytes() == b"first line\n"  # flushed while the service still runs
        proc.stdin.write(numbered(20))
    finally:
        out, err = proc.communicate(timeout=10)  # closes stdin: the writer must end by itself
    assert proc.returncode == 0, err
    assert out == numbered(20)
    assert list(files(log)) == ["workbench.log", "workbench.log.1"]
    assert numbered(20).endswith(oldest_first(log))


def test_stop_signals_do_not_end_it_before_the_last_lines(tmp_path):
    proc, log = start(tmp_path)
    proc.stdin.write(b"before\n")
    proc.stdin.flush()
    assert proc.stdout.readline() == b"before\n"
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # as a process-group signal would
        proc.send_signal(sig)
    time.sleep(0.2)
    assert proc.poll() is None
    proc.stdin.write(b"shutting down\n")
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert log.read_bytes() == b"before\nshutting down\n"


def test_it_keeps_writing_the_file_when_stdout_is_gone(tmp_path):
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody reads stdout any more: EPIPE
    proc, log = start(tmp_path, stdout=write_end)
    os.close(write_end)
    _, err = proc.communicate(numbered(10), timeout=10)
    assert proc.returncode == 0
    assert b"stdout is gone" in err
    assert log.read_bytes() == numbered(10)
