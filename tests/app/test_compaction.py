"""History compaction (app/agent/compaction.py): pure functions, no server."""

from __future__ import annotations

import asyncio
import json

from app.agent.compaction import NOTE_HEAD, Level, split_turns, stub_tool_result
from app.agent.compaction import compact as compact_async

SYSTEM = {"role": "system", "content": "You are the lab assistant."}


def count(messages: list[dict]) -> int:
    """A deterministic stand-in for the estimator: 4 characters per token, system included."""
    return len(json.dumps([SYSTEM, *messages])) // 4


def compact(conversation, history_len, count_fn, budget, chunk_chars, level=Level(), headroom=0):
    async def acount(messages):
        return count_fn(messages)
    return asyncio.run(compact_async(conversation, history_len, acount, budget, chunk_chars, level, headroom))


def turn(n: int, result_chars: int = 1200, answer_chars: int = 1500, artifact: bool = False) -> list[dict]:
    result = f"reading {n}: " + "x" * result_chars
    if artifact:
        result += f"\n[trimmed by the workbench: the full result has 9000 characters, kept as artifact art{n}]"
    return [
        {"role": "user", "content": f"question {n}"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": f"call{n}", "type": "function", "function": {"name": "echo", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": f"call{n}", "content": result},
        {"role": "assistant", "content": f"answer {n}: " + "y" * answer_chars},
    ]


def history(n_turns: int, **kw) -> list[dict]:
    return [m for i in range(1, n_turns + 1) for m in turn(i, **kw)]


def current(text: str = "the new question") -> list[dict]:
    return [{"role": "user", "content": text}]


def test_a_conversation_that_fits_is_sent_unchanged():
    conversation = [*history(2), *current()]
    done = compact(conversation, len(conversation) - 1, count, budget=10_000, chunk_chars=4000)
    assert done.messages == conversation and not done.compacted
    assert done.tokens_before == done.tokens_after == count(conversation)
    assert done.past_turns == 2


def test_older_tool_results_are_reduced_first_with_a_link_to_the_full_result():
    past = history(4, artifact=True)
    conversation = [*past, *current()]
    full = count(conversation)
    done = compact(conversation, len(past), count, budget=full - 300, chunk_chars=3000)
    assert done.compacted and done.dropped_turns == 0 and done.reduced_turns >= 1
    assert done.tokens_after <= full - 300 < done.tokens_before
    first_tool = done.messages[2]
    assert first_tool["role"] == "tool" and first_tool["tool_call_id"] == "call1"
    assert first_tool["content"].startswith("reading 1: xxx")
    assert "the full result is artifact art1" in first_tool["content"] and len(first_tool["content"]) < 400
    assert done.messages[3]["content"].startswith("answer 1: yyy") and "shortened by the workbench" in \
        done.messages[3]["content"]
    # the newest turns and the current turn stay as they were
    assert done.messages[-len(turn(4)) - 1:] == [*turn(4, artifact=True), *current()]


def test_a_result_without_an_artifact_links_to_its_tool_call_and_short_results_stay():
    long = stub_tool_result({"role": "tool", "tool_call_id": "c9", "content": "z" * 1000})
    assert "tool call c9 in the run trace" in long["content"]
    short = {"role": "tool", "tool_call_id": "c1", "content": "ok"}
    assert stub_tool_result(short) == short


def test_oldest_turns_are_dropped_into_a_note_and_the_current_turn_is_kept():
    past = history(8)
    mine = [{"role": "user", "content": "the new question"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "now", "type": "function", "function": {"name": "echo", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "now", "content": "r" * 2000}]
    conversation = [*past, *mine]
    done = compact(conversation, len(past), count, budget=1500, chunk_chars=3000)
    assert done.dropped_turns >= 1 and done.tokens_after <= 1500
    assert done.messages[-3:] == mine  # the current turn, untouched (its tool result too)
    first = done.messages[0]
    assert first["role"] == "user" and first["content"].startswith(NOTE_HEAD)
    assert f"{done.dropped_turns} earlier turn(s) left out" in first["content"]
    assert '- asked "question 1" -> answer 1: yyy' in first["content"]
    kept_questions = [m["content"].split("\n\n")[-1] for m in done.messages if m["role"] == "user"]
    assert "question 1" not in kept_questions and kept_questions[-1] == "the new question"
    # every kept tool call still has its result (the API rejects orphans)
    calls = {c["id"] for m in done.messages for c in m.get("tool_calls") or []}
    results = {m["tool_call_id"] for m in done.messages if m["role"] == "tool"}
    assert calls == results


def test_when_nothing_fits_the_most_compact_form_is_returned():
    past = history(3)
    conversation = [*past, {"role": "user", "content": "q" * 20_000}]
    done = compact(conversation, len(past), count, budget=100, chunk_chars=3000)
    assert done.dropped_turns == 3 and done.tokens_after > 100
    assert done.messages[-1]["content"].endswith("q" * 20_000)


def test_a_growing_session_extends_its_last_request_except_when_the_level_steps():
    """Request k+1 repeats request k (its whole conversation) unless compaction stepped in
    call k+1; the level never goes back down, and it steps far less often than it compacts."""
    budget, chunk = 2500, 2500  # a turn is about a tenth of the budget, a chunk about three turns
    sent: list = []
    past: list[dict] = []
    level = Level()
    for n in range(1, 41):
        done = compact([*past, *current(f"question {n}")], len(past), count, budget, chunk, level,
                       headroom=budget // 4)
        assert done.level.reduced >= level.reduced and done.level.dropped >= level.dropped
        assert done.stepped == (done.level != level)
        assert done.tokens_after <= budget
        sent.append(done)
        level = done.level
        past += turn(n, result_chars=300, answer_chars=400)
    compacted = [i for i, done in enumerate(sent) if done.compacted]
    stepped = [i for i, done in enumerate(sent) if done.stepped]
    assert len(compacted) >= 20 and 3 <= len(stepped) < len(compacted) // 3
    assert any(done.dropped_turns for done in sent)
    for i in range(1, len(sent)):
        previous, now = sent[i - 1].messages, sent[i].messages
        extends = now[:len(previous)] == previous
        assert extends != (i in stepped), f"request {i + 1}: extends {extends}, stepped {i in stepped}"


def test_a_step_leaves_the_headroom_free_where_a_level_does():
    past = history(8, result_chars=300, answer_chars=400)
    conversation = [*past, *current()]
    full = count(conversation)
    tight = compact(conversation, len(past), count, full - 50, 1000)
    roomy = compact(conversation, len(past), count, full - 50, 1000, headroom=600)
    assert tight.stepped and roomy.stepped
    assert tight.tokens_after <= full - 50 < tight.tokens_after + 600
    assert roomy.tokens_after <= full - 50 - 600 and roomy.level.reduced >= tight.level.reduced
    hopeless = compact(conversation, len(past), count, full - 50, 1000, headroom=full)  # no level leaves it
    assert hopeless.level == tight.level  # the first step that fits, not the most compact


def test_a_level_once_reached_is_kept_even_when_less_would_fit():
    """The branch's level is rendered first: a shorter message (or a retry) never un-compacts."""
    past = history(6)
    level = compact([*past, *current("q" * 4000)], len(past), count, 2500, 3000).level
    assert level.reduced > 0
    again = compact([*past, *current("short")], len(past), count, 1_000_000, 3000, level)
    assert again.level == level and not again.stepped and again.compacted


def test_the_same_history_at_the_same_level_compacts_the_same_way_so_a_fork_sends_what_the_original_sent():
    past = history(6)
    original = compact([*past, *current("question 7")], len(past), count, 2000, 3000)
    fork = compact([*past, *current("another question 7")], len(past), count, 2000, 3000, original.level)
    assert original.compacted and not fork.stepped
    assert original.messages[:-1] == fork.messages[:-1]


def test_a_level_beyond_the_history_is_read_at_its_turn_boundaries():
    """A level from a longer history (a thread seeded again from the turn tree) never cuts a turn."""
    past = history(3)
    done = compact([*past, *current()], len(past), count, 1_000_000, 3000, Level(reduced=6, dropped=99))
    assert done.level == Level(reduced=4, dropped=4)
    assert done.messages[0]["content"].startswith(NOTE_HEAD)


def test_split_turns_starts_a_turn_at_each_user_message():
    assert [len(t) for t in split_turns(history(3))] == [4, 4, 4]
    assert split_turns([]) == []


def test_a_level_over_turns_with_nothing_to_shorten_sends_them_unchanged_and_says_so():
    """Reducing short turns changes nothing: the request is not marked compacted (no span)."""
    past = history(3, result_chars=10, answer_chars=10)
    conversation = [*past, *current()]
    done = compact(conversation, len(past), count, 1_000_000, 3000, Level(reduced=len(past)))
    assert done.messages == conversation and not done.compacted and done.reduced_turns == 0
    assert done.level == Level(reduced=len(past))
