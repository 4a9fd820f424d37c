"""`read_artifact`: page through a tool result the workbench trimmed (seed 003, issue 13).

When a result is too large for the context, the workbench keeps it in full as an artifact and
names its id in the trimmed text. This tool reads that artifact back a page at a time through
`ctx.artifact_reader` (id -> full text; LookupError when the id is unknown to the session),
which the app provides; without one the tool says so. A page is cut so that the result,
rendered as compact JSON, fits `ctx.result_budget_chars`: a page the workbench trimmed again
would hide what the model asked for.
"""

from __future__ import annotations

import json

from tools.base import Tool, ToolContext, ToolError, object_schema

PAGE_CHARS = 1500


def read_artifact(ctx: ToolContext, artifact_id: str, offset: int = 0, limit: int = PAGE_CHARS) -> dict:
    if ctx.artifact_reader is None:
        raise ToolError("artifacts cannot be read here: the workbench provides no artifact store")
    try:
        text = ctx.artifact_reader(artifact_id.strip())
    except LookupError:
        raise ToolError(f"no artifact {artifact_id!r} in this session; use the id named in a "
                        "'[trimmed by the workbench ...]' note") from None
    if offset > len(text):
        raise ToolError(f"offset {offset} is past the end of artifact {artifact_id} ({len(text)} characters)")
    def page(size: int) -> dict:
        end = offset + len(text[offset:offset + size])
        return {"artifact_id": artifact_id.strip(), "offset": offset, "total_chars": len(text),
                "next_offset": end if end < len(text) else None, "text": text[offset:end]}

    budget = ctx.result_budget_chars
    if budget is None or _rendered_chars(page(limit)) <= budget:
        return page(limit)
    low, high = 1, limit  # escaping (newlines, quotes) varies: find the largest page that fits
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if _rendered_chars(page(middle)) <= budget else (low, middle - 1)
    return page(low)


def _rendered_chars(result: dict) -> int:
    """Length as the workbench renders a result (compact JSON, non-ASCII kept)."""
    return len(json.dumps(result, ensure_ascii=False, separators=(",", ":")))


READ_ARTIFACT = Tool(
    "read_artifact", "Read a trimmed tool result in full, a page at a time, by its artifact id.",
    object_schema({"artifact_id": {"type": "string"},
                   "offset": {"type": "integer", "minimum": 0},
                   "limit": {"type": "integer", "minimum": 100, "maximum": PAGE_CHARS}},
                  ["artifact_id"]),
    read_artifact)
