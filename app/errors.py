"""Readable workbench errors: every one becomes ``{"error": {"message", "type"}}`` with its status."""

from __future__ import annotations


class WorkbenchError(Exception):
    status_code = 400
    error_type = "invalid_request"

    def __init__(self, message: str, error_type: str | None = None, status_code: int | None = None) -> None:
        super().__init__(message)
        self.message = _readable(message)
        if error_type:
            self.error_type = error_type
        if status_code:
            self.status_code = status_code

    def to_body(self) -> dict:
        return {"error": {"message": self.message, "type": self.error_type}}


def _readable(message: str, limit: int = 600) -> str:
    """Messages quote what the client sent (ids, names); a 10,000-character id is elided in the middle."""
    if len(message) <= limit:
        return message
    return f"{message[:limit - 100]}...[{len(message) - limit + 20} characters elided]...{message[-80:]}"


class NotFound(WorkbenchError):
    status_code = 404
    error_type = "not_found"


class Conflict(WorkbenchError):
    status_code = 409
    error_type = "conflict"


class MessageTooLong(WorkbenchError):
    status_code = 413
    error_type = "message_too_long"
