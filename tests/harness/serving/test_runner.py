"""The replay runner against the scripted OpenAI fake over real HTTP.

No assertion here bounds a duration from above: scheduling is checked through ordering
(starts after the previous turn ended, starts not before ``t``) and overlap counts.
"""

import json
import threading

import pytest

from app.replay.cli import main as replay_main
from harness.manifest import ManifestLine, write_manifest
from harness.reports.results import load_results
from harness.serving.runner import ReplaySettings, hint_states, replay
from harness.serving.streamed_request import Measurement, _Accumulator
from tests.fakes.scripted_openai import ScriptedOpenAI, ScriptedReply


def chat_line(session, text, t=0.0, branch="main", expected=4, **body):
    return ManifestLine(t=t, session_id=session, branch_id=branch,
                        body={"messages": [{"role": "user", "content": text}], **body},
                        expected_output_tokens=expected)


def fake_prompt_tokens(body):  # the fake's own accounting, see tests/fakes/scripted_openai.py
    return max(1, len(json.dumps(body["messages"])) // 4)


def max_overlap(results):
    events = sorted([(r.start_s, 1) for r in results] + [(r.start_s + r.latency_s, -1) for r in results],
                    key=lambda e: (e[0], e[1]))
    level = best = 0
    for _, step in events:
        level += step
        best = max(best, level)
    return best


async def test_records_ttft_latency_tokens_and_cache():
    lines = [chat_line("s", "first question"), chat_line("s", "second question, longer", model="m-x")]
    replies = [ScriptedReply(content="alpha beta gamma", delay_s=0.05, cached_tokens=0),
               ScriptedReply(content="delta", delay_s=0.05, cached_tokens=3, cache_source="S")]
    with ScriptedOpenAI(replies) as fake:
        result = await replay(lines, ReplaySettings(base_url=fake.base_url, progress=False, ideal="words"))
        sent = fake.bodies
    first, second = result.requests
    for r, line in zip(result.requests, lines):
        assert r.ok, r.error
        assert r.prompt_tokens == fake_prompt_tokens(line.body)
        assert r.ttft_s >= 0.05 and r.latency_s >= r.ttft_s
        assert r.cached_tokens_from == "usage" and r.status == 200
    assert (first.completion_tokens, first.cached_tokens, first.cache_source) == (3, 0, None)
    assert (second.completion_tokens, second.cached_tokens, second.cache_source) == (1, 3, "S")
    assert second.computed_tokens == second.prompt_tokens - 3
    # bodies: streamed with usage, model filled from /v1/models unless given, max_tokens from the manifest
    assert all(b["stream"] is True and b["stream_options"] == {"include_usage": True} for b in sent)
    assert sent[0]["model"] == "scripted-fake" and sent[1]["model"] == "m-x"
    assert sent[0]["max_tokens"] == 4
    s = result.summary
    assert s["ok"] == 2 and s["errors"] == 0
    assert s["tokens"]["prompt"] == first.prompt_tokens + second.prompt_tokens
    assert s["tokens"]["cached"] == 3 and s["tokens"]["completion"] == 4
    assert s["tokens"]["computed"] == s["tokens"]["prompt"] - 3
    assert s["cache_sources"] == {"S": 1}
    assert s["ideal"]["unit"] == "words" and "computed_over_ideal_estimate" in s["ideal"]
    assert result.metadata["server"]["models"]["data"][0]["id"] == "scripted-fake"
    assert result.metadata["mode"] == "concurrency" and result.metadata["concurrency"] == 1


async def test_errors_are_recorded_and_the_run_goes_on():
    lines = [chat_line("a", "one"), chat_line("b", "two"), chat_line("c", "three")]
    replies = [ScriptedReply(content="ok"), ScriptedReply(status=503), ScriptedReply(content="ok")]
    with ScriptedOpenAI(replies) as fake:
        result = await replay(lines, ReplaySettings(base_url=fake.base_url, progress=False, ideal="off"))
    assert [r.ok for r in result.requests] == [True, False, True]
    assert result.requests[1].status == 503 and "scripted failure" in result.requests[1].error
    assert result.summary["errors"] == 1 and "ideal" not in result.summary


async def test_unreachable_server_is_an_error_per_request():
    from tests.fakes.scripted_openai import free_port

    lines = [chat_line("a", "one")]
    result = await replay(lines, ReplaySettings(base_url=f"http://127.0.0.1:{free_port()}", progress=False,
                                                ideal="off", timeout_s=5))
    assert result.requests[0].error and "Connect" in result.requests[0].error


async def test_concurrency_limit_and_session_order():
    # 3 sessions x 3 turns; replies are slow enough for requests to overlap.
    lines = [chat_line(f"s{s}", f"session {s} turn {k}") for k in range(3) for s in range(3)]
    with ScriptedOpenAI(lambda body: ScriptedReply(content="fine", delay_s=0.15)) as fake:
        result = await replay(lines, ReplaySettings(base_url=fake.base_url, concurrency=2, progress=False,
                                                    ideal="off"))
        order = [b["messages"][0]["content"] for b in fake.bodies]
    assert all(r.ok for r in result.requests)
    assert max_overlap(result.requests) == 2
    for s in range(3):
        turns = [r for r in result.requests if r.session_id == f"s{s}"]
        for earlier, later in zip(turns, turns[1:]):
            assert later.start_s >= earlier.start_s + earlier.latency_s
        assert [o for o in order if o.startswith(f"session {s} ")] == [f"session {s} turn {k}" for k in range(3)]


async def test_schedule_honours_t_and_is_not_capped():
    lines = [chat_line(f"u{i}", f"prompt {i}", t=0.0) for i in range(4)] + [
        chat_line("late", "late prompt", t=0.4)]
    with ScriptedOpenAI(lambda body: ScriptedReply(content="x", delay_s=0.2)) as fake:
        result = await replay(lines, ReplaySettings(base_url=fake.base_url, schedule=True, progress=False,
                                                    ideal="off"))
    assert all(r.ok for r in result.requests)
    assert all(r.start_s >= r.scheduled_t for r in result.requests)
    assert max_overlap(result.requests[:4]) == 4
    assert result.metadata["mode"] == "schedule"


async def test_branches_wait_for_the_trunk_then_run_together():
    lines = [chat_line("f", "trunk", branch="trunk")] + [chat_line("f", f"branch {b}", branch=f"b{b}")
                                                          for b in range(3)]
    with ScriptedOpenAI(lambda body: ScriptedReply(content="x", delay_s=0.15)) as fake:
        result = await replay(lines, ReplaySettings(base_url=fake.base_url, concurrency=4, progress=False,
                                                    ideal="off"))
        hints = {r["headers"]["x-arbor-session"]: r["headers"]["x-arbor-cache-state"] for r in fake.requests}
    trunk, *branches = result.requests
    assert all(b.start_s >= trunk.start_s + trunk.latency_s for b in branches)
    assert max_overlap(branches) == 3
    # one key per session/branch, as the workbench sends; each branch ends its only turn, the trunk
    # goes on in its branches (a collaboration wait)
    assert hints == {"f/trunk": "active", "f/b0": "done", "f/b1": "done", "f/b2": "done"}


def _tool_step(session, branch="main"):
    """A request that continues a turn with a tool result (the step after a tool call)."""
    return ManifestLine(t=0.0, session_id=session, branch_id=branch, expected_output_tokens=4, body={
        "messages": [{"role": "user", "content": "q"},
                     {"role": "assistant", "content": "", "tool_calls": [
                         {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                     {"role": "tool", "tool_call_id": "c1", "content": "42"}]})


def test_hint_states_follow_the_recorded_turns():
    lines = [chat_line("s", "q1"), _tool_step("s"), chat_line("s", "q2"), chat_line("s", "alt", branch="b"),
             _tool_step("s", branch="b"), chat_line("t", "other")]
    assert hint_states(lines) == ["tool_wait",  # the next request of s/main carries a tool result
                                  "done",       # then the user asks again: the turn had ended
                                  "active",     # branch b forks from it: its KV goes on (collaboration wait)
                                  "tool_wait", "done", "done"]


async def test_recorded_body_hints_never_reach_the_server():
    recorded = {"session": "old-session/old-branch", "state": "active", "pin": True}
    lines = [chat_line("s", "q1", cache=recorded), _tool_step("s")]
    for hints_on in (True, False):
        with ScriptedOpenAI(lambda body: ScriptedReply(content="x")) as fake:
            result = await replay(lines, ReplaySettings(base_url=fake.base_url, progress=False, ideal="off",
                                                        session_hints=hints_on))
        assert all(r.ok for r in result.requests)
        assert all("cache" not in b for b in fake.bodies)
        headers = [r["headers"] for r in fake.requests]
        if hints_on:
            assert [(h["x-arbor-session"], h["x-arbor-cache-state"]) for h in headers] == [
                ("s/main", "tool_wait"), ("s/main", "done")]
            # the tool wait names the tool the next request brings the result of; a finished turn names none
            assert [h.get("x-arbor-cache-tool") for h in headers] == ["f", None]
        else:
            assert not any(k.startswith("x-arbor") for h in headers for k in h), "--no-session-hints"


async def test_ideal_on_server_tokens_when_the_server_tokenizes():
    fake = ScriptedOpenAI(lambda body: ScriptedReply(content="x"))
    calls = {"n": 0}
    lock = threading.Lock()

    # llama-server style routes added to the fake: a toy template and one token per character
    @fake.app.post("/apply-template")
    async def apply_template(payload: dict):
        with lock:
            calls["n"] += 1
        return {"prompt": "".join(f"<{m['role']}>{m['content']}" for m in payload["messages"])}

    @fake.app.post("/tokenize")
    async def tokenize(payload: dict):
        return {"tokens": [ord(c) for c in payload["content"]]}

    lines = [chat_line("a", "shared start then A"), chat_line("b", "shared start then B")]
    with fake:
        result = await replay(lines, ReplaySettings(base_url=fake.base_url, progress=False))
    ideal = result.summary["ideal"]
    full = len("<user>shared start then A")
    assert calls["n"] == 2 and ideal["unit"] == "tokens"
    assert ideal["total_prompt_tokens"] == 2 * full
    assert ideal["ideal_computed_tokens"] == full + 1
    computed = result.summary["tokens"]["computed"]
    assert ideal["computed_over_ideal"] == pytest.approx(computed / (full + 1))
    # the fake's usage counts differ from these toy tokens, and the summary says so
    assert ideal["prompt_token_mismatches"] == 2


def test_cached_tokens_fall_back_to_llama_server_timings():
    m = Measurement(started=0.0)
    acc = _Accumulator(m)
    acc.feed({"choices": [{"delta": {"content": "hi"}, "finish_reason": None}]}, 1.0)
    acc.feed({"choices": [{"delta": {}, "finish_reason": "stop"}],
              "timings": {"cache_n": 7, "prompt_n": 5, "predicted_n": 2}}, 2.0)
    acc.finish()
    assert (m.first_token, m.finish_reason) == (1.0, "stop")
    assert (m.prompt_tokens, m.cached_tokens, m.cached_tokens_from, m.completion_tokens) == (12, 7, "timings", 2)


def test_cli_replay_writes_results(tmp_path, capsys):
    manifest = tmp_path / "m.jsonl"
    write_manifest([chat_line("s", "hello"), chat_line("s", "again")], manifest)
    out = tmp_path / "r.json"
    with ScriptedOpenAI(lambda body: ScriptedReply(content="a b", cached_tokens=1)) as fake:
        code = replay_main([str(manifest), "--base-url", fake.base_url.removesuffix("/v1"), "--out", str(out),
                            "--no-progress", "--label", "fake", "--concurrency", "2"])
    assert code == 0
    loaded = load_results(out)
    assert loaded.metadata["label"] == "fake" and loaded.metadata["manifest"] == str(manifest)
    assert [r.completion_tokens for r in loaded.requests] == [2, 2]
    assert "requests 2  ok 2  errors 0" in capsys.readouterr().out


def test_cli_bad_input_is_a_clear_error(tmp_path, capsys):
    missing = tmp_path / "missing.jsonl"
    assert replay_main([str(missing), "--base-url", "http://127.0.0.1:1"]) == 2
    assert "arbor replay: error" in capsys.readouterr().err
    manifest = tmp_path / "m.jsonl"
    write_manifest([chat_line("s", "hello")], manifest)
    assert replay_main([str(manifest), "--base-url", "ftp://x"]) == 2
    assert "http://" in capsys.readouterr().err


async def test_a_line_waits_after_its_predecessor_for_its_tools():
    """`after_s`: the next turn is sent that long after the previous one ended, outside the concurrency gate."""
    first = chat_line("s", "turn 0")
    second = ManifestLine(t=0.0, session_id="s", branch_id="main", expected_output_tokens=4, after_s=0.3,
                          body={"messages": [{"role": "user", "content": "turn 1"}]})
    other = chat_line("o", "another session")
    with ScriptedOpenAI(lambda body: ScriptedReply(content="x", delay_s=0.05)) as fake:
        result = await replay([first, second, other], ReplaySettings(base_url=fake.base_url, concurrency=1,
                                                                      progress=False, ideal="off"))
    a, b, c = result.requests
    assert all(r.ok for r in result.requests)
    assert b.start_s >= a.start_s + a.latency_s + 0.3
    assert c.start_s < b.start_s, "another session went ahead while the tool ran (the gate was free)"
