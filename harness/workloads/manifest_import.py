"""Import AIPerf ``inputs.json`` sessions (the ``inputs_json`` dataset format) as manifest lines.

The file is one JSON object: ``{"data": [{"session_id": str | null, "payloads": [body, ...]}]}``
where each payload is a complete OpenAI request body, one per turn, in order. AIPerf
records no arrival times, so session ``i`` is given ``t = i * session_interval_s`` and all
its turns share that ``t`` (the runner sends a session's turns one after another).

Only chat bodies (``messages``) are imported: the replay runner sends every line to
``/v1/chat/completions``, so a completions body (``prompt``) is refused here, at import, with
the payload's position, rather than failing later in the middle of a replay.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.manifest import ManifestLine
from harness.workloads.generators import MAIN_BRANCH


class AIPerfFormatError(ValueError):
    """The input is not an AIPerf inputs.json document."""


def _expected_output(body: dict) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def aiperf_to_manifest(document: Any, session_interval_s: float = 0.0) -> list[ManifestLine]:
    """Convert a parsed inputs.json document to manifest lines (session by session)."""
    if session_interval_s < 0:
        raise ValueError(f"session_interval_s must not be negative, got {session_interval_s}")
    if not isinstance(document, dict) or not isinstance(document.get("data"), list):
        raise AIPerfFormatError('expected a JSON object with a "data" list of sessions (AIPerf inputs.json)')
    lines: list[ManifestLine] = []
    seen: set[str] = set()
    for i, session in enumerate(document["data"]):
        if not isinstance(session, dict) or not isinstance(session.get("payloads"), list):
            raise AIPerfFormatError(f'data[{i}] must be an object with a "payloads" list')
        session_id = session.get("session_id") or f"aiperf-{i}"
        if not isinstance(session_id, str):
            raise AIPerfFormatError(f"data[{i}].session_id must be a string or null")
        if session_id in seen:
            raise AIPerfFormatError(f"data[{i}].session_id {session_id!r} appears twice")
        seen.add(session_id)
        for j, body in enumerate(session["payloads"]):
            if isinstance(body, dict) and "prompt" in body and "messages" not in body:
                raise AIPerfFormatError(f"data[{i}].payloads[{j}] is a completions body (prompt); replay sends "
                                        "chat requests only: export the AIPerf dataset with messages (chat endpoint)")
            if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
                raise AIPerfFormatError(f"data[{i}].payloads[{j}] must be an OpenAI chat request body "
                                        "(an object with a messages list)")
            lines.append(ManifestLine(t=round(i * session_interval_s, 6), session_id=session_id, branch_id=MAIN_BRANCH,
                                      body=body, expected_output_tokens=_expected_output(body)))
    return lines


def import_aiperf_inputs(path: str | Path, session_interval_s: float = 0.0) -> list[ManifestLine]:
    """Read an AIPerf inputs.json file and convert it (see :func:`aiperf_to_manifest`)."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise AIPerfFormatError(f"{path}: not valid JSON ({exc})") from exc
    return aiperf_to_manifest(document, session_interval_s)
