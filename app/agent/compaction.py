"""History compaction (seed 003's tool-context compression, applied to whole turns).

When a conversation no longer fits the model's context, older turns are made smaller, the
oldest first, until the request fits:

1. *reduced*: its tool results shrink to their first characters plus a link to the full
   result (the artifact the trimmed form already names, else the tool call in the run trace),
   and long answers and questions are shortened (an extractive summary of the turn);
2. *dropped*: the turn leaves the request; one line per dropped turn (question -> start of
   the answer) goes into a note at the front of the first message kept.

The system prompt and the current turn are never touched. Turns are compacted in *chunks*:
the past turns are cut, from the oldest, into groups of about `chunk_chars` characters, and a
chunk is reduced or dropped as a whole. The cut depends only on the history (not on the
calibrated token estimate), and grows only at the end, so

- the compacted request keeps the prefix of the previous one up to the chunk that changed:
  the server's prefix cache keeps reusing it, and compaction moves only every chunk's worth of
  growth instead of on every call;
- the same history compacts the same way every time, so a fork from turn T sends what the
  original branch sent after T (and hits the same cache).

The order of levels is: reduce chunks 1, 1-2, ..., all; then drop chunks 1, 1-2, ..., all
(dropped chunks were reduced first). The first level that fits wins.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
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
class Compaction:
    """The conversation to send and what compaction did to it (token counts are estimates)."""

    messages: list[dict]
    tokens_before: int
    tokens_after: int
    past_turns: int
    reduced_turns: int = 0  # reduced and still present
    dropped_turns: int = 0

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


def chunk_turns(turns: list[Turn], chunk_chars: int) -> list[list[Turn]]:
    """Greedy groups of whole turns, from the oldest, each about `chunk_chars` characters."""
    chunks: list[list[Turn]] = []
    size = chunk_chars
    for turn in turns:
        chars = len(json.dumps(turn, ensure_ascii=False))
        if size >= chunk_chars:
            chunks.append([])
            size = 0
        chunks[-1].append(turn)
        size += chars
    return chunks


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


def render(chunks: list[list[Turn]], reduced: int, dropped: int, current: list[dict]) -> list[dict]:
    """The conversation with chunks [0, dropped) left out and [dropped, reduced) reduced."""
    messages: list[dict] = []
    for index, chunk in enumerate(chunks[dropped:], start=dropped):
        for turn in chunk:
            messages.extend(reduce_turn(turn) if index < reduced else turn)
    messages.extend(current)
    if dropped and messages:
        messages = _with_note(messages, drop_note([turn for chunk in chunks[:dropped] for turn in chunk]))
    return messages


def compact(conversation: list[dict], history_len: int, count: Callable[[list[dict]], int], budget: int,
            chunk_chars: int) -> Compaction:
    """Fit `conversation` (past turns = its first `history_len` messages, then the current turn)
    into `budget` tokens as `count` measures a request; the most compact form when nothing fits."""
    before = count(conversation)
    past, current = conversation[:history_len], conversation[history_len:]
    chunks = chunk_turns(split_turns(past), chunk_chars)
    n_turns = sum(len(c) for c in chunks)
    if before <= budget or not chunks:
        return Compaction(conversation, before, before, n_turns)
    levels = [(r, 0) for r in range(1, len(chunks) + 1)] + [(len(chunks), d) for d in range(1, len(chunks) + 1)]
    for reduced, dropped in levels:
        messages = render(chunks, reduced, dropped, current)
        after = count(messages)
        if after <= budget or (reduced, dropped) == levels[-1]:
            n_dropped = sum(len(c) for c in chunks[:dropped])
            n_reduced = sum(len(c) for c in chunks[dropped:reduced])
            return Compaction(messages, before, after, n_turns, n_reduced, n_dropped)
    raise AssertionError("unreachable: the last level always returns")
