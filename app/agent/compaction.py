"""History compaction (seed 003's tool-context compression, applied to whole turns) that
only ever moves forward within a branch.

When a conversation no longer fits the model's context, older turns are made smaller, the
oldest first, until the request fits:

1. *reduced*: its tool results shrink to their first characters plus a link to the full
   result (the artifact the trimmed form already names, else the tool call in the run trace),
   and long answers and questions are shortened (an extractive summary of the turn);
2. *dropped*: the turn leaves the request; one line per dropped turn (question -> start of
   the answer) goes into a note at the front of the first message kept.

The system prompt and the current turn are never touched.

A branch's *level* (`Level`: how many messages at the front of its conversation are reduced,
how many of those dropped, always at turn boundaries) is kept in its thread's state
(app/agent/context_state.py): each call starts at the branch's level and renders it first.
Only when that does not fit does the level *step* forward, a chunk of about `chunk_chars`
characters of whole turns at a time (reduce the next chunk of full turns, ..., all; then
drop the next chunk of reduced turns, ...; the first that fits wins). It never goes back
down, so

- between two steps every request extends the previous one (the new turns come after the
  part that is already compacted): the server's prefix cache reuses all of it, and the
  cache is lost only in the call that steps;
- a fork inherits the level in the checkpoint it was copied from, so its first request
  sends what its parent sent at that point (and hits the same cache);
- the chunks are cut from the level's own frontier and from the history only, so the same
  history at the same level compacts the same way every time.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

STUB_CHARS = 200  # a reduced tool result keeps this much of its text
TEXT_CHARS = 600  # a reduced turn keeps this much of a long question or answer
NOTE_LINE_CHARS = 160
NOTE_CHARS = 1500  # the note keeps its newest lines within this size
NOTE_HEAD = "[Earlier conversation compacted by the workbench to fit the model's context."

_ARTIFACT = re.compile(r"kept as artifact (\w+)")
_TRIM_NOTE = "\n[trimmed by the workbench"
_WS = re.compile(r"\s+")

Turn = list[dict]


@dataclass(frozen=True)
class Level:
    """How far a branch's history is compacted: its first `reduced` messages are sent reduced,
    and the first `dropped` of those are left out (a note in their place). Both counts sit on
    turn boundaries of the past turns; `dropped <= reduced`."""

    reduced: int = 0
    dropped: int = 0

    def forward(self, other: Level) -> Level:
        """The further of the two, component by component: a level never goes back down."""
        return Level(max(self.reduced, other.reduced), max(self.dropped, other.dropped))


@dataclass(frozen=True)
class Compaction:
    """The conversation to send and what compaction did to it."""

    messages: list[dict]
    tokens_before: int  # the uncompacted conversation (equal to tokens_after when nothing is compacted)
    tokens_after: int
    past_turns: int
    reduced_turns: int = 0  # reduced and still present
    dropped_turns: int = 0
    level: Level = Level()  # the level sent (the branch's next calls start from it)
    stepped: bool = False  # the level moved forward in this call (the cached prefix is lost once)

    @property
    def compacted(self) -> bool:
        return bool(self.reduced_turns or self.dropped_turns)


def split_turns(past: list[dict]) -> list[Turn]:
    """Past messages grouped by turn: each turn starts at a user message."""
    turns: list[Turn] = []
    for message in past:
        if message.get("role") == "user" or not turns:
            turns.append([])
        turns[-1].append(message)
    return turns


def _flat(text: object) -> str:
    return _WS.sub(" ", text if isinstance(text, str) else json.dumps(text, ensure_ascii=False)).strip()


def _shorten(text: str, limit: int, what: str) -> str:
    if len(text) <= limit + 80:  # not worth a note
        return text
    return f"{text[:limit]}… [{what} shortened by the workbench: {len(text)} characters in full]"


def stub_tool_result(message: dict) -> dict:
    """A tool message reduced to its first characters and a link to the full result."""
    content = message.get("content")
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    if len(text) <= STUB_CHARS + 80:
        return message
    artifact = _ARTIFACT.search(text)
    link = f"artifact {artifact.group(1)}" if artifact else f"tool call {message.get('tool_call_id')} in the run trace"
    head = _flat(text.split(_TRIM_NOTE, 1)[0])[:STUB_CHARS]
    return {**message, "content": f"{head}… [compacted by the workbench: the full result is {link}]"}


def reduce_turn(turn: Turn) -> Turn:
    """The turn with its tool results stubbed and long texts shortened; structure kept."""
    out = []
    for message in turn:
        role, content = message.get("role"), message.get("content")
        if role == "tool":
            out.append(stub_tool_result(message))
        elif role in ("user", "assistant") and isinstance(content, str):
            out.append({**message, "content": _shorten(content, TEXT_CHARS, "answer" if role == "assistant" else
                                                        "message")})
        else:
            out.append(message)
    return out


def summary_line(turn: Turn) -> str:
    """One note line for a dropped turn: its question and the start of its last answer."""
    question = next((_flat(m.get("content")) for m in turn if m.get("role") == "user"), "")
    answers = [m for m in turn if m.get("role") == "assistant" and m.get("content")]
    answer = _flat(answers[-1]["content"]) if answers else "(no answer)"
    line = f'- asked "{question[:70]}" -> {answer}'
    return line[:NOTE_LINE_CHARS - 1] + "…" if len(line) > NOTE_LINE_CHARS else line


def drop_note(dropped: list[Turn]) -> str:
    lines = [summary_line(turn) for turn in dropped]
    kept: list[str] = []
    size = 0
    for line in reversed(lines):  # the newest lines matter most
        if size + len(line) > NOTE_CHARS:
            break
        kept.insert(0, line)
        size += len(line) + 1
    head = f"{NOTE_HEAD} {len(dropped)} earlier turn(s) left out; the run trace has them in full."
    if len(kept) < len(lines):
        head += f" The {len(lines) - len(kept)} oldest are not listed."
    return "\n".join([head, *kept]) + "]"


def _with_note(messages: list[dict], note: str) -> list[dict]:
    # The note joins the first kept message (a user message) rather than being a message of
    # its own: chat templates that insist on alternating roles accept it either way.
    first = messages[0]
    if first.get("role") == "user" and isinstance(first.get("content"), str):
        return [{**first, "content": f"{note}\n\n{first['content']}"}, *messages[1:]]
    return [{"role": "user", "content": note}, *messages]


def turn_ends(past: list[dict]) -> list[int]:
    """The message offsets where the past turns end (each turn starts at a user message)."""
    ends, offset = [], 0
    for turn in split_turns(past):
        offset += len(turn)
        ends.append(offset)
    return ends


def render(past: list[dict], level: Level, current: list[dict]) -> list[dict]:
    """The conversation at `level`: past[:dropped] left out (a note instead), past[dropped:reduced]
    reduced, the rest of the past and the current turn as they are."""
    messages = [*reduce_turn(past[level.dropped:level.reduced]), *past[level.reduced:], *current]
    if level.dropped and messages:
        messages = _with_note(messages, drop_note(split_turns(past[:level.dropped])))
    return messages


def _chunk_end(past: list[dict], ends: list[int], start: int, chunk_chars: int) -> int:
    """The end of the chunk of whole turns that starts at `start`: about `chunk_chars` characters."""
    size, previous = 0, start
    for end in ends:
        if end <= start:
            continue
        size += len(json.dumps(past[previous:end], ensure_ascii=False))
        previous = end
        if size >= chunk_chars:
            return end
    return previous


def steps_after(past: list[dict], level: Level, chunk_chars: int) -> list[Level]:
    """The levels past `level`, in order: reduce the next chunk of full turns, ..., all; then
    drop the next chunk of reduced turns, ..., all."""
    ends = turn_ends(past)
    levels: list[Level] = []
    reduced, dropped = level.reduced, level.dropped
    while reduced < len(past):
        reduced = _chunk_end(past, ends, reduced, chunk_chars)
        levels.append(Level(reduced, dropped))
    while dropped < len(past):
        dropped = _chunk_end(past, ends, dropped, chunk_chars)
        levels.append(Level(reduced, dropped))
    return levels


def _on_boundaries(level: Level, past: list[dict]) -> Level:
    """`level` within `past`, on its turn boundaries (a level from a longer or different history,
    e.g. a thread seeded from the turn tree, is read as the nearest level not beyond it)."""
    ends = [0, *turn_ends(past)]
    reduced = max(e for e in ends if e <= level.reduced)
    return Level(reduced, max(e for e in ends if e <= min(level.dropped, reduced)))


async def compact(conversation: list[dict], history_len: int, count: Callable[[list[dict]], Awaitable[int]],
                  budget: int, chunk_chars: int, level: Level = Level(), headroom: int = 0) -> Compaction:
    """Fit `conversation` (past turns = its first `history_len` messages, then the current turn)
    into `budget` tokens as `count` measures a request, starting at the branch's `level` and
    stepping forward only when that does not fit; the most compact form when nothing fits.

    A step goes on until the request leaves `headroom` tokens free (where some level does):
    the turns that follow then fit without stepping again at once, so the cache is lost once
    per `headroom` of growth rather than on every call of a full context."""
    past, current = conversation[:history_len], conversation[history_len:]
    level = _on_boundaries(level, past)
    n_turns = len(split_turns(past))
    candidate, messages = level, render(past, level, current)
    after = await count(messages)
    if after > budget:
        fitting = None  # the first step that fits at all: taken when none leaves the headroom
        for candidate in steps_after(past, level, chunk_chars):
            messages = render(past, candidate, current)
            after = await count(messages)
            if after <= budget - headroom:
                break
            if after <= budget and fitting is None:
                fitting = (candidate, messages, after)
        else:
            if fitting is not None:
                candidate, messages, after = fitting
    if messages == conversation:  # level 0, or reduced turns that had nothing long to shorten
        return Compaction(messages, after, after, n_turns, level=candidate, stepped=candidate != level)
    before = await count(conversation)
    # a turn counts as reduced when reducing changed it (short turns stay as they were)
    reduced = sum(1 for turn in split_turns(past[candidate.dropped:candidate.reduced]) if reduce_turn(turn) != turn)
    return Compaction(messages, before, after, n_turns, reduced_turns=reduced,
                      dropped_turns=len(split_turns(past[:candidate.dropped])), level=candidate,
                      stepped=candidate != level)
