"""One session's three turns, each through another API (chat completions, responses, messages),
recorded by `arbor replay record` in front of the real arbor-server (embedded model) and then
replayed from the recorded manifest.

What must hold: the proxy records each request under its own API with the body as sent; the
replay sends each line to its API and reads each API's usage; prompt tokens agree with the
server's own tokenization of the chat equivalent (so the three APIs render the same prompt);
and because the turns extend one conversation, the second and third reuse the first's KV
although they arrive through other APIs.
"""

import httpx
import pytest

from harness.manifest import read_manifest
from harness.serving.runner import ReplaySettings, replay
from harness.workloads.api_shapes import line_as
from harness.workloads.generators import agent_sessions
from tests.app.replay.test_record import recording_proxy
from tests.server.conftest import start_server, stop_server

pytestmark = pytest.mark.model

APIS = ("chat", "responses", "messages")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    running = start_server(tmp_path_factory.mktemp("three-apis"), "--parallel", "2", "--ctx-size", "4096")
    yield running
    stop_server(running)


def _send(client: httpx.Client, proxy: str, line, model: str, stream: bool) -> None:
    body = {**line.body, "model": model, "stream": stream}
    if stream and line.api == "chat":
        body["stream_options"] = {"include_usage": True}
    headers = {"X-Arbor-Session": line.cache_session}
    if stream:
        with client.stream("POST", proxy + line.path, json=body, headers=headers) as answer:
            text = "".join(answer.iter_text())
        assert answer.status_code == 200, text[:500]
    else:
        answer = client.post(proxy + line.path, json=body, headers=headers)
        assert answer.status_code == 200, answer.text[:500]


async def test_record_and_replay_one_line_per_api(server, tmp_path):
    work = agent_sessions(sessions=1, turns=3, system_len=120, user_len=16, tool_result_len=40, tool_call_len=8,
                          output_len=8)
    lines = [line_as(line, api) for line, api in zip(work.lines, APIS)]
    model = httpx.get(server.v1 + "/models", timeout=30).json()["data"][0]["id"]
    out = tmp_path / "captured.jsonl"
    with recording_proxy(server.base_url, out) as proxy, httpx.Client(timeout=300) as client:
        for line, stream in zip(lines, (False, True, True)):
            _send(client, proxy, line, model, stream)
    recorded = read_manifest(out)
    assert [ln.api for ln in recorded] == list(APIS)
    assert [(ln.session_id, ln.branch_id) for ln in recorded] == [(lines[0].session_id, "main")] * 3
    assert [ln.body["messages" if ln.api != "responses" else "input"] for ln in recorded] == [
        ln.body["messages" if ln.api != "responses" else "input"] for ln in lines]
    assert all(ln.expected_output_tokens and ln.expected_output_tokens <= 8 for ln in recorded)

    result = await replay(recorded, ReplaySettings(base_url=server.v1, progress=False, ideal="server"))
    for r, api in zip(result.requests, APIS):
        assert r.ok, r.error
        assert r.api == api and r.status == 200
        assert r.ttft_s is not None and r.latency_s >= r.ttft_s
        assert r.prompt_tokens and r.completion_tokens and r.cached_tokens_from == "usage"
    ideal = result.summary["ideal"]
    assert ideal["unit"] == "tokens" and ideal["prompt_token_mismatches"] == 0, result.requests
    first, second, third = result.requests
    # the replay started on a warm server (the recording ran the same prompts): every line reuses
    # KV; the later lines at least the earlier line's prompt, though it came through another API
    assert second.cached_tokens >= first.prompt_tokens - 1
    assert third.cached_tokens >= second.prompt_tokens - 1
