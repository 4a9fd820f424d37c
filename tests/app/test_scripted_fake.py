"""The scripted OpenAI fake speaks the protocol the real openai client expects."""

import openai
import pytest

from tests.fakes.scripted_openai import ScriptedReply, scripted_server, tool_call


def test_non_stream_reply_carries_usage_cache_and_tool_calls():
    reply = ScriptedReply(tool_calls=[tool_call("f", {"a": 1})], cached_tokens=3, cache_source="S")
    with scripted_server([reply]) as fake:
        client = openai.OpenAI(base_url=fake.base_url, api_key="x")
        raw = client.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": "hello there"}], extra_headers={"X-Arbor-Session": "s1"})
        data = raw.http_response.json()
    assert data["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'
    assert data["usage"]["prompt_tokens_details"]["cached_tokens"] == 3
    assert data["arbor"]["cache"]["source"] == "S"
    assert fake.requests[0]["headers"]["x-arbor-session"] == "s1"


def test_stream_assembles_content_tool_calls_and_usage():
    with scripted_server([ScriptedReply(content="one two three", tool_calls=[tool_call("g", {"x": "y"}, "c1")],
                                        cached_tokens=2)]) as fake:
        client = openai.OpenAI(base_url=fake.base_url, api_key="x")
        stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                stream=True, stream_options={"include_usage": True})
        text, args, usage = "", "", None
        for chunk in stream:
            if chunk.usage:
                usage = chunk.usage
            for choice in chunk.choices:
                text += choice.delta.content or ""
                for tc in choice.delta.tool_calls or []:
                    args += tc.function.arguments or ""
    assert text == "one two three"
    assert args == '{"x": "y"}'
    assert usage.prompt_tokens_details.cached_tokens == 2
    assert "arbor" not in fake.requests[0]  # only recorded body+headers
    assert fake.bodies[0]["stream"] is True


def test_error_status_and_exhausted_script():
    with scripted_server([ScriptedReply(status=503)]) as fake:
        client = openai.OpenAI(base_url=fake.base_url, api_key="x", max_retries=0)
        with pytest.raises(openai.InternalServerError):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(openai.InternalServerError, match="no scripted reply left"):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
