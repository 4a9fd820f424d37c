"""The story writer's library tools: look-ups in the corpus, chapter summaries, draft checks."""

import pytest

from scenarios.story_writer.generate_corpus import generate_corpus
from scenarios.story_writer.scenario import LIBRARY
from tools.base import ToolContext, ToolError, run_tool
from tools.story_library import story_library_tools
from tools.workspace import MemoryWorkspace

CORPUS = generate_corpus(4000)
TOOLS = {t.name: t for t in story_library_tools(CORPUS, LIBRARY)}


async def call(ctx, tool, **arguments):
    return await run_tool(TOOLS[tool], ctx, arguments)


@pytest.fixture
def ctx():
    return ToolContext(workspace=MemoryWorkspace())


async def test_characters_and_locations_by_name(ctx):
    grandfather = await call(ctx, "find_character", name="林守义")
    assert grandfather["age"] == 82 and "蓝色墨水" in grandfather["traits"]
    assert (await call(ctx, "find_character", name="守义"))["name"] == "林守义"  # one close match is enough
    with pytest.raises(ToolError, match="no character called '老王'; known: 林澈、苏晚、林守义、"):
        await call(ctx, "find_character", name="老王")
    reef = await call(ctx, "find_location", name="礁石滩")
    assert "暗礁" in reef["description"] and any("海燕号" in e for e in reef["events"])
    with pytest.raises(ToolError, match="no location called '月球'"):
        await call(ctx, "find_location", name="月球")


async def test_timeline_and_logbook(ctx):
    events = (await call(ctx, "read_timeline", from_year=1985, to_year=1988))["events"]
    years = [e["year"] for e in events]
    assert years == sorted(years) and {1987, 1988} <= set(years)
    empty = await call(ctx, "read_timeline", from_year=2001, to_year=2002)
    assert empty["events"] == [] and "1948 to 1988" in empty["note"]
    with pytest.raises(ToolError, match="from_year 1990 is after to_year 1980"):
        await call(ctx, "read_timeline", from_year=1990, to_year=1980)
    year = CORPUS.logbook[0].year
    entries = (await call(ctx, "read_logbook", year=year))["entries"]
    assert entries == [{"date": e.date, "text": e.text} for e in CORPUS.logbook if e.year == year]
    with pytest.raises(ToolError, match="no entry for 2020; years with entries: "):
        await call(ctx, "read_logbook", year=2020)


async def test_search_archive_spans_logbook_timeline_and_people(ctx):
    found = await call(ctx, "search_archive", query="海燕号 三长一短")
    assert found["total"] >= 1 and found["hits"][0]["source"] == "timeline" and found["hits"][0]["where"] == "1987年"
    people = await call(ctx, "search_archive", query="罗盘")
    assert ("character", "苏晚") in [(h["source"], h["where"]) for h in people["hits"]]
    assert len((await call(ctx, "search_archive", query="灯", limit=2))["hits"]) == 2
    with pytest.raises(ToolError, match="query is empty"):
        await call(ctx, "search_archive", query="  ")


async def test_summarize_chapter_reads_the_manuscript(ctx):
    summary = await call(ctx, "summarize_chapter", number=2)
    assert summary["title"] == "第二章 旧日志" and summary["beats"][0] == "地下室的门卡住了。"
    assert summary["ending"].startswith("林澈把日志夹在腋下") and "林澈" in summary["characters"]
    with pytest.raises(ToolError, match="no chapter 9; the manuscript has chapters 1, 2"):
        await call(ctx, "summarize_chapter", number=9)


async def test_check_draft_names_the_facts_and_the_style_problems(ctx):
    draft = '苏晚爬上一百二十级台阶，把罗盘放在桌上。"灯几点亮？"她问。'
    report = await call(ctx, "check_draft", text=draft)
    assert any("length" in p for p in report["problems"]) and any("Chinese quotes" in p for p in report["problems"])
    assert "雾港只有一条石板路通往灯塔，共一百二十级台阶。" in report["facts_to_keep"]
    assert any("罗盘" in f for f in report["facts_to_keep"]) and report["characters"] == ["苏晚"]
    fine = await call(ctx, "check_draft", text="雾。" * 200)
    assert fine["problems"] == [] and fine["chars"] == 400
    with pytest.raises(ToolError, match="the draft is empty"):
        await call(ctx, "check_draft", text=" ")
