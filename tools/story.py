"""Tools of the story_writer scenario: read and search a manuscript, append a chapter.

A `StoryLibrary` is a folder holding `outline.md`, `characters.md`, `style_guide.md`,
`continuity.md` and `chapters/NN.md` (the shipped manuscript). Chapters the operator approves
are written to `ctx.workspace_dir/story_writer/chapters/` (never into the shipped folder), and
the manuscript is the shipped chapters followed by those. `story_tools(library)` builds the
tools for one library, so scenarios hand their data in and tools/ imports no scenario.
Missing chapters, empty queries or a missing workspace raise `ToolError`.
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
        """Shipped chapters, then the approved ones of the workspace, in chapter order."""
        return self.shipped_chapters() + _read_chapters(_drafts_dir(ctx, create=False))


def _drafts_dir(ctx: ToolContext, create: bool) -> Path | None:
    if ctx.workspace_dir is None:
        if create:
            raise ToolError("no workspace folder is configured: approved chapters cannot be saved")
        return None
    folder = Path(ctx.workspace_dir) / "story_writer" / "chapters"
    if create:
        folder.mkdir(parents=True, exist_ok=True)
    return folder


def _read_chapters(folder: Path | None) -> list[Chapter]:
    if folder is None or not folder.is_dir():
        return []
    chapters = []
    for path in sorted(folder.iterdir()):
        match = _CHAPTER_FILE.match(path.name)
        if match:
            text = path.read_text(encoding="utf-8").strip()
            first_line = text.splitlines()[0] if text else ""
            chapters.append(Chapter(int(match.group(1)), first_line.lstrip("# ").strip(), text))
    return sorted(chapters, key=lambda c: c.number)


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
    number = max((c.number for c in library.manuscript(ctx)), default=0) + 1
    path = _drafts_dir(ctx, create=True) / f"{number:02d}.md"
    # exclusive create: two approvals racing for one number must not overwrite each other
    with path.open("x", encoding="utf-8") as handle:
        handle.write(f"# {title.strip()}\n\n{text.strip()}\n")
    return {"appended_chapter": number, "title": title.strip(), "chars": len(text.strip())}


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
