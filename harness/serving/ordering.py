"""Which earlier request each manifest line must wait for.

Rules (documented in docs/replay.md):
- lines of the same session and branch run in manifest order;
- a session's *trunk* is the branch of its first line; the first line of any other branch
  forks from the trunk, so it waits for the latest earlier trunk line of its session;
A plain session has a single branch, so its lines simply run in order.
"""

from __future__ import annotations

from collections.abc import Sequence

from harness.manifest import ManifestLine


def predecessors(lines: Sequence[ManifestLine]) -> list[int | None]:
    """For each line, the index of the line it waits for, or None."""
    trunk_of: dict[str, str | None] = {}
    last_of_branch: dict[tuple[str, str | None], int] = {}
    waits: list[int | None] = []
    for index, line in enumerate(lines):
        session = line.session_id
        branch = line.branch_id
        if session not in trunk_of:
            trunk_of[session] = branch
        key = (session, branch)
        if key in last_of_branch:
            waits.append(last_of_branch[key])
        elif branch != trunk_of[session]:
            waits.append(last_of_branch.get((session, trunk_of[session])))
        else:
            waits.append(None)
        last_of_branch[key] = index
    return waits
