"""The files a tool may write: the workspace of the branch its turn runs on.

A tool never writes the filesystem; it writes through `ctx.workspace`, which the workbench
binds to one branch (app/services/workspace.py keeps the files as rows of its database, so a
fork starts from its parent's files at the fork point, a sibling never sees them, and
deleting the branch or the session removes them). Paths are relative, '/'-separated names
("story_writer/chapters/03.md").

Files are written once (`create`; a new chapter is a new file): with no overwrites, every
fork point has exactly one set of files, and no version history is needed to give it.

`MemoryWorkspace` is the same contract in a dict, for tools used without the workbench and
for their unit tests.
"""

from __future__ import annotations

import re
from typing import Protocol

_PATH = re.compile(r"^[\w.\-]+(/[\w.\-]+)*$")
MAX_PATH_CHARS = 300


class Workspace(Protocol):
    def files(self, prefix: str = "") -> dict[str, str]:
        """path -> content of every file whose path starts with `prefix`, in path order."""

    def read(self, path: str) -> str | None:
        """The content of `path`; None when there is no such file."""

    def create(self, path: str, content: str) -> None:
        """Write a new file; FileExistsError when `path` exists (two writers racing for one name)."""


def check_path(path: str) -> str:
    """`path` when it is a relative '/'-separated name (no '..', no empty parts); else ValueError."""
    if len(path) > MAX_PATH_CHARS or not _PATH.match(path) or any(p in (".", "..") for p in path.split("/")):
        raise ValueError(f"not a workspace path: {path!r} (relative names separated by '/', "
                         f"at most {MAX_PATH_CHARS} characters)")
    return path


class MemoryWorkspace:
    """A `Workspace` in memory."""

    def __init__(self) -> None:
        self._files: dict[str, str] = {}

    def files(self, prefix: str = "") -> dict[str, str]:
        return {p: self._files[p] for p in sorted(self._files) if p.startswith(prefix)}

    def read(self, path: str) -> str | None:
        return self._files.get(path)

    def create(self, path: str, content: str) -> None:
        if check_path(path) in self._files:
            raise FileExistsError(path)
        self._files[path] = content
