"""Request manifests: every model request of a session as one JSON line.

The workbench writes it (app/services/traces.py); the replay reads it (harness/serving/runner.py,
`arbor replay`); both import this module:

    {"t": 12.5, "session_id": "...", "branch_id": "...", "body": {...}, "expected_output_tokens": 87,
     "api": "responses"}

- ``t``: seconds since the session started when the request was sent (float, >= 0);
- ``session_id`` / ``branch_id``: the workbench ids the request belongs to; the cache
  session of its hints is ``"<session_id>/<branch_id>"`` (`ManifestLine.cache_session`), the
  same key the workbench sends and replay uses;
- ``body``: the exact request body as it was sent to the API named by ``api`` (for chat: the
  model, messages, tools, tool_choice, stream, stream_options, max_tokens, the ``cache`` hint ...);
- ``expected_output_tokens``: completion tokens the server produced for it (``None`` when
  unknown), so a replay can ask for the same amount of output;
- ``api``: which API the body was sent to, so a replay sends it to the same one: ``chat``
  (``POST /v1/chat/completions``), ``responses`` (OpenAI's ``POST /v1/responses``) or
  ``messages`` (Anthropic's ``POST /v1/messages``). A line without it is a chat line: every
  manifest written before the field existed is one, and reads back unchanged; chat lines are
  still written without it, so a chat manifest is the same file it always was.

Lines are written in arrival order (``t`` ascending).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

#: The APIs a manifest line may name, with the path each is served at.
API_PATHS: dict[str, str] = {
    "chat": "/v1/chat/completions",
    "responses": "/v1/responses",
    "messages": "/v1/messages",
}
CHAT = "chat"


class ManifestError(ValueError):
    """A manifest line that is not valid JSON or lacks a field; the message names the line."""


@dataclass(frozen=True)
class ManifestLine:
    t: float
    session_id: str
    branch_id: str
    body: dict[str, Any]
    expected_output_tokens: int | None = None
    api: str = CHAT
    # seconds between the end of the request this one waits for and its sending (its branch's tools
    # running, an approval): the replay waits that long; None: at once (or at `t` with --schedule)
    after_s: float | None = None

    def __post_init__(self) -> None:
        if self.api not in API_PATHS:
            raise ManifestError(f"api must be one of {', '.join(API_PATHS)}, got {self.api!r}")
        if self.after_s is not None and not self.after_s >= 0:
            raise ManifestError(f"after_s must be a non-negative number of seconds, got {self.after_s!r}")

    @property
    def path(self) -> str:
        """The path the line's body is sent to (``/v1/chat/completions``, ``/v1/responses`` ...)."""
        return API_PATHS[self.api]

    @property
    def cache_session(self) -> str:
        """The cache hints' session key of this line: ``"<session_id>/<branch_id>"``, the key the
        workbench's hints name a branch by (app/agent/cache_hints.py, `hint_key`; a test keeps the two
        the same)."""
        return f"{self.session_id}/{self.branch_id}"

    def to_json(self) -> str:
        data = asdict(self)
        if self.api == CHAT:  # a chat line is written as before the field existed
            del data["api"]
        if self.after_s is None:  # likewise a line without a wait
            del data["after_s"]
        return json.dumps(data, ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ManifestLine:
        missing = [k for k in ("t", "session_id", "branch_id", "body") if k not in data]
        if missing:
            raise ManifestError(f"manifest line lacks {', '.join(missing)}")
        api = data.get("api")
        api = CHAT if api is None else api
        if api not in API_PATHS:
            raise ManifestError(f"api must be one of {', '.join(API_PATHS)}, got {api!r}")
        _check_body(api, data["body"])
        expected = data.get("expected_output_tokens")
        after = data.get("after_s")
        return cls(
            t=float(data["t"]),
            session_id=str(data["session_id"]),
            branch_id=str(data["branch_id"]),
            body=data["body"],
            expected_output_tokens=None if expected is None else int(expected),
            api=api,
            after_s=None if after is None else float(after),
        )


def _check_body(api: str, body: Any) -> None:
    """The least a body of `api` must have to be sent: chat and messages a messages list,
    responses an input (a string or items) or the response it continues."""
    if api == "responses":
        if not isinstance(body, dict) or not (isinstance(body.get("input"), (str, list))
                                              or isinstance(body.get("previous_response_id"), str)):
            raise ManifestError("manifest line body must be a responses request object with an input "
                                "(a string or a list of items)")
    elif not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        raise ManifestError(f"manifest line body must be a {api} request object with a messages list")


def dumps_manifest(lines: Iterable[ManifestLine]) -> str:
    """The JSONL text of `lines` (one line each, trailing newline)."""
    return "".join(line.to_json() + "\n" for line in lines)


def write_manifest(lines: Iterable[ManifestLine], target: str | Path | IO[str]) -> int:
    """Write `lines` as JSONL to a path or text stream; returns the number of lines."""
    text_lines = [line.to_json() + "\n" for line in lines]
    if isinstance(target, (str, Path)):
        Path(target).write_text("".join(text_lines), encoding="utf-8")
    else:
        target.writelines(text_lines)
    return len(text_lines)


def parse_manifest(text: str, source: str = "<manifest>") -> Iterator[ManifestLine]:
    """Parse JSONL text; blank lines are skipped; bad lines raise ManifestError with their number."""
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ManifestError(f"{source}:{number}: not JSON ({exc.msg})") from None
        if not isinstance(data, dict):
            raise ManifestError(f"{source}:{number}: a manifest line must be a JSON object")
        try:
            yield ManifestLine.from_dict(data)
        except (ManifestError, TypeError, ValueError) as exc:
            raise ManifestError(f"{source}:{number}: {exc}") from None


def read_manifest(path: str | Path) -> list[ManifestLine]:
    """Read a manifest file (see `parse_manifest`)."""
    path = Path(path)
    return list(parse_manifest(path.read_text(encoding="utf-8"), source=str(path)))
