"""Tools of the story_writer scenario: read and search a manuscript, append a chapter.

A `StoryLibrary` is a folder holding `outline.md`, `characters.md`, `style_guide.md`,
`continuity.md` and `chapters/NN.md` (the shipped manuscript). Chapters the operator approves
are files `story_writer/chapters/NN.md` of the branch's workspace (`ctx.workspace`,
tools/workspace.py; never the shipped folder), so they belong to the branch the turn runs
on: a fork sees its parent's chapters at the fork point, a sibling never sees them. The
manuscript is the shipped chapters followed by those (`StoryLibrary.manuscript`, `save_chapter`:
the functions every story tool reads and writes chapters through). `story_tools(library)`
builds the tools for one library, so scenarios hand their data in and tools/ imports no
scenario. Missing chapters, empty queries or a missing workspace raise `ToolError`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tools.artifacts import READ_ARTIFACT
from tools.base import Tool, ToolContext, ToolError, object_schema

_CHAPTER_FILE = re.compile(r"^(\d+)\.md$")
_MAX_HITS = 10


@dataclass(frozen=True)
class Chapter:
    number: int
    title: str
    text: str


@dataclass(frozen=True)
class StoryLibrary:
    """The shipped story files of one scenario (read-only)."""

    data_dir: Path

    def document(self, name: str) -> str:
        return (self.data_dir / name).read_text(encoding="utf-8").strip()

    def shipped_chapters(self) -> list[Chapter]:
        return _read_chapters(self.data_dir / "chapters")

    def manuscript(self, ctx: ToolContext) -> list[Chapter]:
        """Shipped chapters, then the approved ones of the branch's workspace, in chapter order."""
        saved = ctx.workspace.files(CHAPTERS) if ctx.workspace is not None else {}
        return self.shipped_chapters() + _chapters(
            {path.removeprefix(CHAPTERS): text for path, text in saved.items()})


CHAPTERS = "story_writer/chapters/"  # where approved chapters go in a branch's workspace


def _read_chapters(folder: Path) -> list[Chapter]:
    if not folder.is_dir():
        return []
    return _chapters({path.name: path.read_text(encoding="utf-8") for path in folder.iterdir()})


def _chapters(files: dict[str, str]) -> list[Chapter]:
    """The chapters among `files` (file name -> text; names "NN.md"), in chapter order."""
    chapters = []
    for name, text in files.items():
        match = _CHAPTER_FILE.match(name)
        if match:
            text = text.strip()
            first_line = text.splitlines()[0] if text else ""
            chapters.append(Chapter(int(match.group(1)), first_line.lstrip("# ").strip(), text))
    return sorted(chapters, key=lambda c: c.number)


def save_chapter(library: StoryLibrary, ctx: ToolContext, title: str, text: str) -> Chapter:
    """Add the next chapter to the branch's workspace (numbered after the manuscript's last)."""
    if ctx.workspace is None:
        raise ToolError("no workspace is configured: approved chapters cannot be saved")
    number = max((c.number for c in library.manuscript(ctx)), default=0) + 1
    chapter = Chapter(number, title.strip(), f"# {title.strip()}\n\n{text.strip()}")
    try:  # written once: two approvals racing for one number must not overwrite each other
        ctx.workspace.create(f"{CHAPTERS}{number:02d}.md", chapter.text + "\n")
    except FileExistsError:
        raise ToolError(f"chapter {number} was just added by another approval; propose the chapter again") from None
    return chapter


def render_manuscript(chapters: list[Chapter]) -> str:
    return "\n\n".join(c.text for c in chapters)


def _chapter(library: StoryLibrary, ctx: ToolContext, number: int) -> Chapter:
    chapters = library.manuscript(ctx)
    for chapter in chapters:
        if chapter.number == number:
            return chapter
    known = ", ".join(str(c.number) for c in chapters) or "none"
    raise ToolError(f"no chapter {number}; the manuscript has chapters {known}")


def _search(library: StoryLibrary, ctx: ToolContext, query: str, limit: int) -> dict:
    """Paragraphs containing every whitespace-separated term of `query` (Chinese has no word
    boundaries, so terms match as substrings), in manuscript order."""
    terms = query.split()
    if not terms:
        raise ToolError("query is empty: give one or more terms separated by spaces")
    hits = []
    for chapter in library.manuscript(ctx):
        for paragraph in chapter.text.split("\n\n"):
            if not paragraph.startswith("#") and all(t in paragraph for t in terms):
                hits.append({"chapter": chapter.number, "text": paragraph.strip()})
    return {"query": query, "total": len(hits), "hits": hits[:limit]}


def _append(library: StoryLibrary, ctx: ToolContext, title: str, text: str) -> dict:
    if not title.strip() or not text.strip():
        raise ToolError("a chapter needs a non-empty title and text")
    chapter = save_chapter(library, ctx, title, text)
    return {"appended_chapter": chapter.number, "title": chapter.title, "chars": len(text.strip())}


def story_tools(library: StoryLibrary) -> tuple[Tool, ...]:
    """The tools over `library`; `append_chapter` needs the operator's approval and is applied
    (the file written) only once approved."""
    def read_outline(ctx: ToolContext) -> dict:
        return {"outline": library.document("outline.md"), "characters": library.document("characters.md")}

    def read_style_guide(ctx: ToolContext) -> dict:
        return {"style_guide": library.document("style_guide.md")}

    def read_continuity_notes(ctx: ToolContext) -> dict:
        return {"continuity_notes": library.document("continuity.md")}

    def list_chapters(ctx: ToolContext) -> dict:
        return {"chapters": [{"number": c.number, "title": c.title, "chars": len(c.text)}
                             for c in library.manuscript(ctx)]}

    def read_chapter(ctx: ToolContext, number: int) -> dict:
        chapter = _chapter(library, ctx, number)
        return {"number": chapter.number, "title": chapter.title, "text": chapter.text}

    def search_manuscript(ctx: ToolContext, query: str, limit: int = 5) -> dict:
        return _search(library, ctx, query, limit)

    def append_chapter(ctx: ToolContext, title: str, text: str) -> dict:
        return _append(library, ctx, title, text)

    return (
        Tool("read_outline", "The story outline and the characters.", object_schema({}), read_outline),
        Tool("read_style_guide", "The style guide every chapter follows.", object_schema({}), read_style_guide),
        Tool("read_continuity_notes", "Facts earlier chapters fixed (continuity notes).",
             object_schema({}), read_continuity_notes),
        Tool("list_chapters", "Chapters of the manuscript: number, title, length.",
             object_schema({}), list_chapters),
        Tool("read_chapter", "The full text of one chapter.",
             object_schema({"number": {"type": "integer", "minimum": 1}}, ["number"]), read_chapter),
        Tool("search_manuscript", "Paragraphs of the manuscript containing all the given terms.",
             object_schema({"query": {"type": "string", "description": "terms separated by spaces"},
                            "limit": {"type": "integer", "minimum": 1, "maximum": _MAX_HITS}},
                           ["query"]),
             search_manuscript),
        Tool("append_chapter", "Propose the next chapter; it is added once the operator approves.",
             object_schema({"title": {"type": "string"}, "text": {"type": "string"}}, ["title", "text"]),
             append_chapter, requires_approval=True, apply_on_approval=True),
        READ_ARTIFACT,  # a long chapter or search result gets trimmed: the model can page through it
    )
