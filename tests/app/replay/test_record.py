"""`arbor replay record`: the recording proxy passes requests through unchanged and writes the
answered ones of the three APIs as manifest lines (against the scripted chat fake, no model;
tests/harness/serving/test_replay_three_apis.py records all three APIs on the real server)."""

import contextlib
import threading
import time

import httpx
import uvicorn

from app.replay.record import build_app, output_tokens, returns_tool_results, session_of
from harness.manifest import read_manifest
from tests.fakes.scripted_openai import ScriptedOpenAI, ScriptedReply
from tests.server.conftest import free_port


@contextlib.contextmanager
def recording_proxy(upstream: str, out):
    """The proxy on a free loopback port, in a thread; yields its base URL."""
    port = free_port()
    app = build_app(upstream, out)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="recording-proxy", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the recording proxy did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_session_of_reads_headers_then_the_body():
    assert session_of({"x-arbor-session": "s1/b2"}, {}) == ("s1", "b2")
    assert session_of({"session_id": "codex-1"}, {"prompt_cache_key": "k"}) == ("codex-1", "main")
    assert session_of({}, {"prompt_cache_key": "conv-9"}) == ("conv-9", "main")
    assert session_of({}, {"metadata": {"user_id": "user_x_session_y"}}) == ("user_x_session_y", "main")
    assert session_of({}, {}) == ("capture", "main")


def test_output_tokens_of_whole_answers():
    assert output_tokens("chat", {"usage": {"completion_tokens": 3}}) == 3
    assert output_tokens("responses", {"usage": {"output_tokens": 4}}) == 4
    assert output_tokens("messages", {"usage": {"input_tokens": 9, "output_tokens": 5}}) == 5
    assert output_tokens("chat", {}) is None


def test_proxy_passes_answers_through_and_records_chat_requests(tmp_path):
    out = tmp_path / "captured.jsonl"
    replies = [ScriptedReply(content="alpha beta gamma"), ScriptedReply(content="delta"),
               ScriptedReply(content="never recorded", status=500)]
    with ScriptedOpenAI(replies) as fake, recording_proxy(fake.base_url, out) as proxy:
        whole = {"model": "m", "messages": [{"role": "user", "content": "one"}], "max_tokens": 8}
        answer = httpx.post(proxy + "/v1/chat/completions", json=whole, headers={"X-Arbor-Session": "s/b"}, timeout=30)
        assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"] == "alpha beta gamma"
        streamed = {"model": "m", "messages": [{"role": "user", "content": "two"}], "stream": True,
                    "stream_options": {"include_usage": True}}
        with httpx.stream("POST", proxy + "/v1/chat/completions", json=streamed, timeout=30) as response:
            text = "".join(response.iter_text())
        assert response.status_code == 200 and "delta" in text and "[DONE]" in text
        failed = httpx.post(proxy + "/v1/chat/completions", json=whole, timeout=30)
        assert failed.status_code == 500
        assert httpx.get(proxy + "/v1/models", timeout=30).json()["data"][0]["id"] == "scripted-fake"
        sent = fake.bodies
    lines = read_manifest(out)
    assert [ln.body for ln in lines] == [whole, streamed] == sent[:2]
    assert [(ln.api, ln.session_id, ln.branch_id) for ln in lines] == [("chat", "s", "b"), ("chat", "capture", "main")]
    assert [ln.expected_output_tokens for ln in lines] == [3, 1]
    assert lines[0].t <= lines[1].t


def test_an_unreachable_upstream_is_a_502_and_nothing_is_recorded(tmp_path):
    out = tmp_path / "captured.jsonl"
    with recording_proxy(f"http://127.0.0.1:{free_port()}", out) as proxy:
        answer = httpx.post(proxy + "/v1/messages", json={"messages": []}, timeout=30)
    assert answer.status_code == 502 and "upstream" in answer.json()["error"]["message"]
    assert not out.exists()


def test_returns_tool_results_of_the_three_apis():
    tool = {"role": "tool", "tool_call_id": "c1", "content": "42"}
    assert returns_tool_results("chat", {"messages": [{"role": "user", "content": "q"}, tool]})
    assert not returns_tool_results("chat", {"messages": [tool, {"role": "user", "content": "q"}]})
    output = {"type": "function_call_output", "call_id": "c", "output": "1"}
    assert returns_tool_results("responses", {"input": [output]})
    assert not returns_tool_results("responses", {"input": "a plain string"})
    block = {"type": "tool_result", "tool_use_id": "t1", "content": "ok"}
    assert returns_tool_results("messages", {"messages": [{"role": "user", "content": [block]}]})
    assert not returns_tool_results("messages", {"messages": [{"role": "user", "content": "q"}]})
    assert not returns_tool_results("chat", {})


def test_a_request_bringing_tool_results_records_the_tools_time_as_after_s(tmp_path):
    """The wait from the branch's previous answer to the tool-result request is recorded (a replay waits it);
    a user's message records none, and another branch's answer does not count."""
    out = tmp_path / "captured.jsonl"
    replies = [ScriptedReply(content="calling"), ScriptedReply(content="other"), ScriptedReply(content="done"),
               ScriptedReply(content="next")]
    user = {"role": "user", "content": "q"}
    tool = {"role": "tool", "tool_call_id": "c1", "content": "42"}
    with ScriptedOpenAI(replies) as fake, recording_proxy(fake.base_url, out) as proxy:
        def send(messages, branch):
            answer = httpx.post(proxy + "/v1/chat/completions", json={"model": "m", "messages": messages},
                                headers={"X-Arbor-Session": f"s/{branch}"}, timeout=30)
            assert answer.status_code == 200
        send([user], "a")
        time.sleep(0.4)  # the tool runs
        send([user], "b")  # another branch meanwhile
        send([user, tool], "a")
        send([user, tool, {"role": "assistant", "content": "done"}, user], "a")
    lines = read_manifest(out)
    assert [ln.branch_id for ln in lines] == ["a", "b", "a", "a"]
    assert lines[0].after_s is None and lines[1].after_s is None and lines[3].after_s is None
    assert lines[2].after_s is not None and 0.4 <= lines[2].after_s < 30
