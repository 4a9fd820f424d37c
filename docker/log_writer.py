"""Copy a service's output to stdout and to a size-rotated log file (the images' arbor-entrypoint).

    <service> 2>&1 | python3 -I log_writer.py /var/log/arbor/server.log

Reads its standard input until it closes, copying every byte to standard output at once (so
`docker compose logs` sees what it always saw) and every line to FILE, rotated as
`logging.handlers.RotatingFileHandler` rotates: when the next line would take FILE past
ARBOR_LOG_MAX_MB megabytes (default 20; 0 = never rotate), FILE.1 becomes FILE.2 and so on up to
ARBOR_LOG_BACKUPS (default 3; 0 = FILE simply starts over), FILE becomes FILE.1 and a new FILE is
started. So at most (1 + backups) x max bytes of log are kept per service.

- Bytes, not text: invalid UTF-8, NULs or a partial last line are written exactly as they came.
- A line reaches FILE when it is complete (or at EOF, or when it grows longer than a file may
  be, cut in pieces), so a line is never split across two files and no file exceeds the
  maximum; every complete line is flushed to FILE as soon as it is read.
- It never stops reading before EOF: if FILE cannot be written (full disk, removed volume) it
  says so on stderr, keeps copying to stdout and tries FILE again every RETRY_S seconds; if
  stdout goes away it keeps writing FILE. The service never blocks or dies on a dead pipe.
- SIGINT, SIGTERM and SIGHUP are ignored: the service gets the stop signal (the entrypoint execs
  it), and this process exits when the service's output closes, after writing its last lines.

Standard library only, Python 3.8+, one file: the server and workbench images both install it as
/opt/arbor/log_writer.py (docker/*.Dockerfile); tests/deploy/test_log_writer.py imports it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from typing import BinaryIO

MIB = 1024 * 1024
DEFAULT_MAX_MB = 20.0
DEFAULT_BACKUPS = 3
READ_SIZE = 64 * 1024
# Longest piece of one line held back while waiting for its end (memory bound when there is none).
MAX_HELD = 64 * 1024
RETRY_S = 10.0
PROG = "arbor-log-writer"


def _say(message: str) -> None:
    try:
        os.write(2, f"{PROG}: {message}\n".encode("utf-8", "replace"))
    except OSError:
        pass


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class RotatingLog:
    """An append-only file rotated by size; write() takes whole lines (or cuts of one)."""

    def __init__(self, path: str, max_bytes: int, backups: int, retry_s: float = RETRY_S):
        self.path = path
        self.max_bytes = max(0, int(max_bytes))
        self.backups = max(0, int(backups))
        self.retry_s = retry_s
        self.stream: BinaryIO | None = None
        self.size = 0
        self.failed_at: float | None = None
        self.lost = 0
        self._open()

    # -- file handling, every OSError turned into "not writable for now" --------------------

    def _open(self) -> bool:
        try:
            self.stream = open(self.path, "ab")
            self.size = os.fstat(self.stream.fileno()).st_size
        except OSError as exc:
            self._failed(exc)
            return False
        if self.failed_at is not None:
            self.failed_at = None
            _say(f"writing {self.path} again")
            if self.lost:
                note, self.lost = f"{PROG}: {self.lost} bytes of output could not be written here\n", 0
                self.write(note.encode())
        return True

    def _failed(self, exc: OSError) -> None:
        if self.failed_at is None:
            _say(f"cannot write {self.path} ({exc}); output still goes to stdout, retrying every {self.retry_s:g} s")
        self.failed_at = time.monotonic()
        if self.stream is not None:
            try:
                self.stream.close()
            except OSError:
                pass
            self.stream = None

    def _available(self) -> bool:
        if self.stream is not None:
            return True
        if self.failed_at is not None and time.monotonic() - self.failed_at < self.retry_s:
            return False
        return self._open()

    def rollover(self) -> None:
        """FILE.(n-1) -> FILE.n ... FILE -> FILE.1, then a new empty FILE (backups 0: FILE truncated)."""
        try:
            if self.stream is not None:
                self.stream.close()
                self.stream = None
            if self.backups:
                for i in range(self.backups - 1, 0, -1):
                    source = f"{self.path}.{i}"
                    if os.path.exists(source):
                        os.replace(source, f"{self.path}.{i + 1}")
                if os.path.exists(self.path):
                    os.replace(self.path, f"{self.path}.1")
                self.stream = open(self.path, "ab")
            else:
                self.stream = open(self.path, "wb")
            self.size = 0
        except OSError as exc:
            self._failed(exc)

    def write(self, line: bytes) -> None:
        if not line:
            return
        if not self._available():
            self.lost += len(line)
            return
        if self.max_bytes and self.size and self.size + len(line) > self.max_bytes:
            self.rollover()
        if self.stream is None:  # a rollover that could not open the new file
            self.lost += len(line)
            return
        try:
            self.stream.write(line)
            self.size += len(line)
        except OSError as exc:
            self.lost += len(line)
            self._failed(exc)

    def flush(self) -> None:
        if self.stream is not None:
            try:
                self.stream.flush()
            except OSError as exc:
                self._failed(exc)

    def close(self) -> None:
        self.flush()
        if self.stream is not None:
            try:
                self.stream.close()
            except OSError:
                pass
            self.stream = None


class LineSplitter:
    """Cuts a byte stream into lines (ending in b"\\n"), none longer than `longest` bytes."""

    def __init__(self, longest: int):
        self.longest = max(1, longest)
        self.held = b""

    def feed(self, data: bytes) -> list[bytes]:
        self.held += data
        out = []
        start = 0
        while True:
            end = self.held.find(b"\n", start)
            if end < 0:
                break
            out.extend(self._cut(self.held[start:end + 1]))
            start = end + 1
        rest = self.held[start:]
        keep = len(rest) % self.longest if len(rest) >= self.longest else len(rest)
        out.extend(self._cut(rest[:len(rest) - keep]))
        self.held = rest[len(rest) - keep:]
        return out

    def finish(self) -> list[bytes]:
        rest, self.held = self.held, b""
        return self._cut(rest)

    def _cut(self, data: bytes) -> list[bytes]:
        return [data[i:i + self.longest] for i in range(0, len(data), self.longest)]


def pump(in_fd: int, out_fd: int | None, log: RotatingLog, read_size: int = READ_SIZE) -> None:
    """Copy in_fd to out_fd (as it comes) and to log (by lines) until in_fd closes."""
    longest = min(MAX_HELD, log.max_bytes) if log.max_bytes else MAX_HELD
    lines = LineSplitter(longest)
    while True:
        data = os.read(in_fd, read_size)
        if not data:
            break
        out_fd = _copy_out(out_fd, data, f"writing only {log.path}")
        for line in lines.feed(data):
            log.write(line)
        log.flush()
    for line in lines.finish():
        log.write(line)
    log.close()


def drain(in_fd: int, out_fd: int | None) -> None:
    """The last resort after an unexpected error: keep the service's pipe open, copy to stdout."""
    while True:
        data = os.read(in_fd, READ_SIZE)
        if not data:
            return
        out_fd = _copy_out(out_fd, data)


def _copy_out(out_fd: int | None, data: bytes, then: str | None = None) -> int | None:
    """Write `data` to `out_fd`; the fd to use next time, None once stdout is gone (said, with
    what happens `then`, when given)."""
    if out_fd is None:
        return None
    try:
        _write_all(out_fd, data)
    except OSError as exc:
        if then:
            _say(f"stdout is gone ({exc}); {then}")
        return None
    return out_fd


def _setting(name: str, default: float, kind: type) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = kind(raw)
    except ValueError:
        value = -1
    if value < 0:
        _say(f"{name}={raw!r} is not a number >= 0; using {default:g}")
        return default
    return value


def settings() -> tuple[int, int]:
    """(max bytes, backups) from ARBOR_LOG_MAX_MB and ARBOR_LOG_BACKUPS."""
    max_mb = _setting("ARBOR_LOG_MAX_MB", DEFAULT_MAX_MB, float)
    backups = _setting("ARBOR_LOG_BACKUPS", DEFAULT_BACKUPS, int)
    return int(max_mb * MIB), int(backups)


def main(argv: list[str] | None = None) -> int:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("file", help="the log file (rotated as FILE.1 ... FILE.<backups>)")
    args = parser.parse_args(argv)
    try:
        max_bytes, backups = settings()
        pump(0, 1, RotatingLog(args.file, max_bytes, backups))
    except Exception as exc:  # noqa: BLE001 - never leave the service writing into a closed pipe
        _say(f"{exc!r}; copying to stdout only")
        drain(0, 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
