"""Wiring of the story_writer scenario: prompt, tools, starter questions, data summary.

The system prompt carries the outline, the characters and the whole shipped manuscript, so
every request of every turn starts with the same long prefix: the workload where KV reuse
matters most (seed 002). Chapters approved later are read through the tools, so they never
change that prefix.
"""

from __future__ import annotations

from pathlib import Path

from scenarios.scenario import Scenario, read_prompt
from tools.story import StoryLibrary, render_manuscript, story_tools

LIBRARY = StoryLibrary(Path(__file__).parent / "data")


def _system_prompt() -> str:
    return "\n\n".join((
        read_prompt(__file__),
        LIBRARY.document("outline.md"),
        "# 人物\n\n" + LIBRARY.document("characters.md"),
        "# 书稿\n\n" + render_manuscript(LIBRARY.shipped_chapters()),
    ))


def _summary() -> dict:
    chapters = LIBRARY.shipped_chapters()
    return {"title": "灯塔守夜人",
            "chapters": [{"number": c.number, "title": c.title, "chars": len(c.text)} for c in chapters],
            "manuscript_chars": sum(len(c.text) for c in chapters)}


SCENARIO = Scenario(
    name="story_writer",
    title="Story writer",
    description="A long-context story agent (Chinese): outline, characters and a growing "
                "manuscript; it searches the book and proposes chapters for approval.",
    system_prompt=_system_prompt(),
    tools=story_tools(LIBRARY),
    starter_questions=(
        "祖父的日志里关于海燕号写了什么？",
        "按照大纲写第三章《来客》。",
        "林澈的左手有什么问题？",
    ),
    summarize=_summary,
)
