"""read_artifact: paging through a trimmed result via the app's reader."""

import json

import pytest

from tools.artifacts import READ_ARTIFACT
from tools.base import ToolContext, ToolError, run_tool

TEXT = "".join(f"{i:04d}" for i in range(1000))  # 4000 characters
STORE = {"art1": TEXT}


def reader(artifact_id):
    return STORE[artifact_id]  # KeyError is a LookupError, as the app's reader raises


async def call(ctx=ToolContext(artifact_reader=reader), **arguments):
    return await run_tool(READ_ARTIFACT, ctx, arguments)


async def test_pages_through_the_whole_text():
    pages, offset = [], 0
    while offset is not None:
        page = await call(artifact_id="art1", offset=offset)
        assert page["total_chars"] == 4000 and page["offset"] == offset
        pages.append(page["text"])
        offset = page["next_offset"]
    assert "".join(pages) == TEXT and len(pages) == 3
    small = await call(artifact_id=" art1 ", offset=3990, limit=100)
    assert small == {"artifact_id": "art1", "offset": 3990, "total_chars": 4000, "next_offset": None,
                     "text": TEXT[3990:]}


@pytest.mark.parametrize("ctx, arguments, message", [
    (ToolContext(), {"artifact_id": "art1"}, "no artifact store"),
    (ToolContext(artifact_reader=reader), {"artifact_id": "nope"}, "no artifact 'nope' in this session"),
    (ToolContext(artifact_reader=reader), {"artifact_id": "art1", "offset": 5000}, "past the end"),
    (ToolContext(artifact_reader=reader), {"artifact_id": "art1", "limit": 5}, "invalid arguments"),
])
async def test_errors_are_readable(ctx, arguments, message):
    with pytest.raises(ToolError, match=message):
        await call(ctx, **arguments)


async def test_a_page_fits_the_result_budget():
    wide = {"art2": "雾\n" * 3000}
    ctx = ToolContext(artifact_reader=wide.__getitem__, result_budget_chars=300)
    page = await call(ctx, artifact_id="art2")

    rendered = json.dumps(page, ensure_ascii=False, separators=(",", ":"))
    assert 250 < len(rendered) <= 300 and page["next_offset"] == len(page["text"])
