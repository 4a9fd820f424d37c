"""Wiring of the story_writer scenario: prompt, tools, starter questions, data summary.

The system prompt carries the outline, the generated reference library (characters, places,
timeline, fixed facts and the grandfather's logbook: generate_corpus.py, its size set by
ARBOR_STORY_CORPUS_CHARS) and the whole shipped manuscript, so every request of every turn
starts with the same long prefix: the workload where KV reuse matters most (seed 002).
Chapters approved later are read through the tools, so they never change that prefix.
"""

from __future__ import annotations

from pathlib import Path

from scenarios.scenario import Scenario, read_prompt
from scenarios.story_writer.generate_corpus import corpus_chars_setting, generate_corpus
from tools.story import StoryLibrary, render_manuscript, story_tools
from tools.story_library import StoryCorpus, story_library_tools

LIBRARY = StoryLibrary(Path(__file__).parent / "data")


def system_prompt(corpus: StoryCorpus) -> str:
    """Instructions, outline, the reference library (`corpus`: characters, places, timeline,
    facts, logbook) and the shipped manuscript: one long prefix shared by every request."""
    return "\n\n".join((
        read_prompt(__file__),
        LIBRARY.document("outline.md"),
        corpus.render(),
        "# 书稿\n\n" + render_manuscript(LIBRARY.shipped_chapters()),
    ))


def _summary(corpus: StoryCorpus) -> dict:
    chapters = LIBRARY.shipped_chapters()
    return {"title": "灯塔守夜人",
            "chapters": [{"number": c.number, "title": c.title, "chars": len(c.text)} for c in chapters],
            "manuscript_chars": sum(len(c.text) for c in chapters),
            "corpus_chars": len(corpus.render()), "logbook_entries": len(corpus.logbook)}


def build_scenario(corpus_chars: int) -> Scenario:
    """The story writer over a corpus of `corpus_chars` characters (generate_corpus.py)."""
    corpus = generate_corpus(corpus_chars)
    return Scenario(
        name="story_writer",
        title="Story writer",
        description="A long-context story agent (Chinese): outline, a reference library of characters, "
                    "places, timeline and logbook, and a growing manuscript; it looks things up, checks "
                    "drafts and proposes chapters for approval.",
        system_prompt=system_prompt(corpus),
        tools=story_tools(LIBRARY) + story_library_tools(corpus, LIBRARY),
        starter_questions=(
            "祖父的日志里关于海燕号写了什么？",
            "按照大纲写第三章《来客》。",
            "林澈的左手有什么问题？",
        ),
        summarize=lambda: _summary(corpus),
    )


SCENARIO = build_scenario(corpus_chars_setting())  # ARBOR_STORY_CORPUS_CHARS sets the size
