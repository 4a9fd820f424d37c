"""story_writer tools: reading, searching, appending chapters to the workspace."""

import pytest

from scenarios.story_writer.scenario import LIBRARY, SCENARIO
from tools.base import ToolContext, ToolError, run_tool
from tools.story import StoryLibrary, story_tools

TOOLS = {t.name: t for t in SCENARIO.tools}


async def call(ctx, name, **arguments):
    return await run_tool(TOOLS[name], ctx, arguments)


@pytest.fixture
def ctx(tmp_path):
    return ToolContext(workspace_dir=tmp_path / "workspace")


def test_prompt_carries_outline_characters_and_manuscript():
    prompt = SCENARIO.system_prompt
    assert "第三章 来客" in prompt and "苏晚" in prompt  # outline and characters
    for chapter in LIBRARY.shipped_chapters():
        assert chapter.text in prompt
    assert [c.number for c in LIBRARY.shipped_chapters()] == [1, 2]


async def test_documents_and_chapters(ctx):
    assert "苏晚" in (await call(ctx, "read_outline"))["characters"]
    assert "第三人称" in (await call(ctx, "read_style_guide"))["style_guide"]
    assert "一百二十级" in (await call(ctx, "read_continuity_notes"))["continuity_notes"]
    listing = await call(ctx, "list_chapters")
    assert [(c["number"], c["title"]) for c in listing["chapters"]] == [(1, "第一章 雾港"), (2, "第二章 旧日志")]
    chapter = await call(ctx, "read_chapter", number=2)
    assert chapter["title"] == "第二章 旧日志" and "三长一短" in chapter["text"]
    with pytest.raises(ToolError, match="no chapter 7; the manuscript has chapters 1, 2"):
        await call(ctx, "read_chapter", number=7)


async def test_search_matches_all_terms_as_substrings(ctx):
    found = await call(ctx, "search_manuscript", query="海燕号 三长一短")
    assert found["total"] == 1 and found["hits"][0]["chapter"] == 2
    assert "一九八七年" in found["hits"][0]["text"]
    assert (await call(ctx, "search_manuscript", query="海燕号 火车"))["total"] == 0
    several = await call(ctx, "search_manuscript", query="林澈", limit=2)
    assert several["total"] > 2 and len(several["hits"]) == 2
    with pytest.raises(ToolError, match="query is empty"):
        await call(ctx, "search_manuscript", query="   ")


async def test_append_writes_the_workspace_never_the_shipped_data(ctx, tmp_path):
    shipped = sorted(p.name for p in (LIBRARY.data_dir / "chapters").iterdir())
    result = await call(ctx, "append_chapter", title="第三章 来客", text="雾夜。有人敲门。")
    assert result == {"appended_chapter": 3, "title": "第三章 来客", "chars": 8}
    written = tmp_path / "workspace" / "story_writer" / "chapters" / "03.md"
    assert written.read_text(encoding="utf-8") == "# 第三章 来客\n\n雾夜。有人敲门。\n"
    assert sorted(p.name for p in (LIBRARY.data_dir / "chapters").iterdir()) == shipped
    # the new chapter is part of the manuscript for every tool
    assert [c["number"] for c in (await call(ctx, "list_chapters"))["chapters"]] == [1, 2, 3]
    assert (await call(ctx, "search_manuscript", query="敲门"))["hits"][0]["chapter"] == 3
    assert (await call(ctx, "append_chapter", title="第四章", text="灯亮了。"))["appended_chapter"] == 4


async def test_append_refuses_without_workspace_or_text(ctx):
    with pytest.raises(ToolError, match="no workspace folder"):
        await call(ToolContext(), "append_chapter", title="t", text="x")
    with pytest.raises(ToolError, match="non-empty title and text"):
        await call(ctx, "append_chapter", title=" ", text="x")
    assert TOOLS["append_chapter"].requires_approval and TOOLS["append_chapter"].apply_on_approval


def test_library_is_passed_in_not_imported(tmp_path):
    (tmp_path / "chapters").mkdir()
    (tmp_path / "chapters" / "05.md").write_text("# 第五章\n\n尾声。", encoding="utf-8")
    (tmp_path / "chapters" / "notes.txt").write_text("ignored", encoding="utf-8")
    library = StoryLibrary(tmp_path)
    assert [(c.number, c.title) for c in library.shipped_chapters()] == [(5, "第五章")]
    assert [t.name for t in story_tools(library)] == list(TOOLS)[:len(story_tools(LIBRARY))]
