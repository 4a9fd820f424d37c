"""The story writer's reference library (a `StoryCorpus`) and the tools over it.

A corpus is the background of a book: character sheets, locations, a timeline and an archive
(the keeper's logbook), plus fixed facts that chapters must not contradict. A scenario builds
one (scenarios/story_writer/generate_corpus.py generates it, deterministically) and puts it in
the system prompt; these tools let the agent look things up in it, summarise manuscript
chapters and check a draft before proposing it (the proposal itself is tools/story.py's
`append_chapter`, applied only once the operator approves).

`story_library_tools(corpus, library)` builds the tools for one corpus and one manuscript
(`StoryLibrary`), so tools/ imports no scenario. Unknown names, empty queries and impossible
ranges raise `ToolError` with what would have worked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tools.base import Tool, ToolContext, ToolError, object_schema
from tools.story import StoryLibrary

_MAX_HITS = 10


@dataclass(frozen=True)
class Character:
    name: str
    age: int
    role: str
    traits: str
    history: str


@dataclass(frozen=True)
class Location:
    name: str
    description: str


@dataclass(frozen=True)
class TimelineEvent:
    year: int
    place: str
    text: str


@dataclass(frozen=True)
class LogEntry:
    """One entry of the archive: `date` as written ("一九六三年三月十二日"), `year`/`month` to find it."""

    year: int
    month: int
    date: str
    text: str


@dataclass(frozen=True)
class Fact:
    """A fixed fact of the book: a draft that mentions `keyword` must agree with `text`."""

    keyword: str
    text: str


@dataclass(frozen=True)
class StoryCorpus:
    title: str
    characters: tuple[Character, ...]
    locations: tuple[Location, ...]
    timeline: tuple[TimelineEvent, ...]
    logbook: tuple[LogEntry, ...]
    facts: tuple[Fact, ...]
    chapter_chars: tuple[int, int]  # the style guide's length of a chapter, in characters

    def render(self) -> str:
        """The corpus as the Markdown the system prompt carries (stable: same corpus, same text)."""
        parts = ["# 资料库", "## 人物档案"]
        parts += [f"- {c.name}（{c.age}岁，{c.role}）：{c.traits}。{c.history}" for c in self.characters]
        parts.append("## 地点")
        parts += [f"- {loc.name}：{loc.description}" for loc in self.locations]
        parts.append("## 年表")
        parts += [f"- {e.year}年，{e.place}：{e.text}" for e in self.timeline]
        parts.append("## 固定事实")
        parts += [f"- {f.text}" for f in self.facts]
        parts.append("## 祖父日志（摘录）")
        parts += [f"- {e.date}：{e.text}" for e in self.logbook]
        return "\n".join(parts)


def _named(items, name: str, kind: str):
    name = name.strip()
    if not name:
        raise ToolError(f"give a {kind} name")
    for item in items:
        if item.name == name:
            return item
    close = [item.name for item in items if name in item.name or item.name in name]
    if len(close) == 1:
        return next(item for item in items if item.name == close[0])
    known = "、".join(item.name for item in items)
    raise ToolError(f"no {kind} called {name!r}; known: {known}")


def _terms(query: str) -> list[str]:
    terms = query.split()
    if not terms:
        raise ToolError("query is empty: give one or more terms separated by spaces")
    return terms


def _search_archive(corpus: StoryCorpus, query: str, limit: int) -> dict:
    """Archive entries, timeline events and character sheets containing every term of `query`
    (Chinese has no word boundaries: terms match as substrings)."""
    terms = _terms(query)
    texts = [("logbook", e.date, e.text) for e in corpus.logbook]
    texts += [("timeline", f"{e.year}年", f"{e.place}：{e.text}") for e in corpus.timeline]
    texts += [("character", c.name, f"{c.role}，{c.traits}。{c.history}") for c in corpus.characters]
    hits = [{"source": source, "where": where, "text": text} for source, where, text in texts
            if all(t in text or t in where for t in terms)]
    return {"query": query, "total": len(hits), "hits": hits[:limit]}


_SENTENCE = re.compile(r"[^。！？]*[。！？]”?")


def _summarize(corpus: StoryCorpus, library: StoryLibrary, ctx: ToolContext, number: int) -> dict:
    """An extractive summary: each paragraph's first sentence, who and where appear, how it ends."""
    chapters = library.manuscript(ctx)
    chapter = next((c for c in chapters if c.number == number), None)
    if chapter is None:
        known = ", ".join(str(c.number) for c in chapters) or "none"
        raise ToolError(f"no chapter {number}; the manuscript has chapters {known}")
    paragraphs = [p.strip() for p in chapter.text.split("\n\n") if p.strip() and not p.startswith("#")]
    # the first sentence, else the first line
    firsts = [m.group(0) if (m := _SENTENCE.match(p)) else p.split("\n", 1)[0] for p in paragraphs]
    return {"number": chapter.number, "title": chapter.title, "chars": len(chapter.text),
            "beats": firsts, "ending": paragraphs[-1] if paragraphs else "",
            "characters": [c.name for c in corpus.characters if c.name in chapter.text],
            "locations": [loc.name for loc in corpus.locations if loc.name in chapter.text]}


def _check_draft(corpus: StoryCorpus, text: str) -> dict:
    """What a draft must agree with (the facts whose keyword it mentions) and where it departs
    from the style guide (length, Chinese quotation marks)."""
    body = text.strip()
    if not body:
        raise ToolError("the draft is empty")
    low, high = corpus.chapter_chars
    problems = []
    if not low <= len(body) <= high:
        problems.append(f"length {len(body)} characters; the style guide asks for {low} to {high}")
    if '"' in body:
        problems.append('dialogue uses ASCII quotes ("); the style guide asks for Chinese quotes “”')
    return {"chars": len(body), "problems": problems,
            "facts_to_keep": [f.text for f in corpus.facts if f.keyword in body],
            "characters": [c.name for c in corpus.characters if c.name in body],
            "locations": [loc.name for loc in corpus.locations if loc.name in body]}


def story_library_tools(corpus: StoryCorpus, library: StoryLibrary) -> tuple[Tool, ...]:
    """Look-ups in `corpus`, chapter summaries of `library`'s manuscript, and a draft check."""
    years = (corpus.timeline[0].year, corpus.timeline[-1].year) if corpus.timeline else (0, 0)

    def find_character(ctx: ToolContext, name: str) -> dict:
        c = _named(corpus.characters, name, "character")
        return {"name": c.name, "age": c.age, "role": c.role, "traits": c.traits, "history": c.history}

    def find_location(ctx: ToolContext, name: str) -> dict:
        loc = _named(corpus.locations, name, "location")
        events = [f"{e.year}年：{e.text}" for e in corpus.timeline if e.place == loc.name]
        return {"name": loc.name, "description": loc.description, "events": events}

    def read_timeline(ctx: ToolContext, from_year: int, to_year: int) -> dict:
        if from_year > to_year:
            raise ToolError(f"from_year {from_year} is after to_year {to_year}")
        events = [{"year": e.year, "place": e.place, "text": e.text} for e in corpus.timeline
                  if from_year <= e.year <= to_year]
        return {"from_year": from_year, "to_year": to_year, "events": events,
                **({} if events else {"note": f"the timeline runs from {years[0]} to {years[1]}"})}

    def read_logbook(ctx: ToolContext, year: int, month: int | None = None) -> dict:
        entries = [{"date": e.date, "text": e.text} for e in corpus.logbook
                   if e.year == year and (month is None or e.month == month)]
        if not entries:
            kept = sorted({e.year for e in corpus.logbook})
            raise ToolError(f"the logbook has no entry for {year}{f'-{month}' if month else ''}; "
                            f"years with entries: {', '.join(map(str, kept))}")
        return {"year": year, "month": month, "entries": entries}

    def search_archive(ctx: ToolContext, query: str, limit: int = 5) -> dict:
        return _search_archive(corpus, query, limit)

    def summarize_chapter(ctx: ToolContext, number: int) -> dict:
        return _summarize(corpus, library, ctx, number)

    def check_draft(ctx: ToolContext, text: str) -> dict:
        return _check_draft(corpus, text)

    name = {"name": {"type": "string"}}
    return (
        Tool("find_character", "A character's sheet: age, role, traits, history.",
             object_schema(name, ["name"]), find_character),
        Tool("find_location", "A place of the story and what happened there.",
             object_schema(name, ["name"]), find_location),
        Tool("read_timeline", "Events of the story's past between two years (inclusive).",
             object_schema({"from_year": {"type": "integer"}, "to_year": {"type": "integer"}},
                           ["from_year", "to_year"]), read_timeline),
        Tool("read_logbook", "The grandfather's logbook entries of one year (or one month of it).",
             object_schema({"year": {"type": "integer"}, "month": {"type": "integer", "minimum": 1, "maximum": 12}},
                           ["year"]), read_logbook),
        Tool("search_archive", "Logbook entries, timeline events and character sheets containing all the terms.",
             object_schema({"query": {"type": "string", "description": "terms separated by spaces"},
                            "limit": {"type": "integer", "minimum": 1, "maximum": _MAX_HITS}}, ["query"]),
             search_archive),
        Tool("summarize_chapter", "A chapter's beats, who and where appear, and how it ends.",
             object_schema({"number": {"type": "integer", "minimum": 1}}, ["number"]), summarize_chapter),
        Tool("check_draft", "Check a draft chapter against the fixed facts and the style guide.",
             object_schema({"text": {"type": "string"}}, ["text"]), check_draft),
    )
