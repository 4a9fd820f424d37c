"""The agent loop on the real engine (issue 59, item 4): arbor-server on the embedded model.

- A call cut by max_tokens: a tool whose arguments are long, named by tool_choice, with a
  max_tokens far too small. The cut try is never run nor sent back; the retry asks for more;
  the turn ends with an answer either way, and the next turn's history is one the same server
  accepts (it refuses arguments that are no JSON object: 400, which used to fail the turn).
- One step's results fitted to the context: the first step's five long tool calls are scripted
  (a proxy answers that one request and passes everything else to arbor-server: its context
  limit, its token counts, the later steps), in a context of 2,048 tokens per slot. The turn
  ends with the real model's answer and the server never refuses a request as too long.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from app.scenario_catalog import ScenarioCatalog
from app.settings import WorkbenchSettings
from scenarios.scenario import Scenario
from tests.app.real_backends import real_backends
from tests.app.support import live_server, new_session, of_type, post_turn, workbench_client
from tests.fakes.scripted_openai import ScriptedReply, _extras, _stream, tool_call
from tools.artifacts import READ_ARTIFACT
from tools.base import Tool, object_schema

pytestmark = [pytest.mark.model, pytest.mark.timeout(900)]


def _save_note(ctx, title: str, text: str) -> dict:
    return {"saved": title, "chars": len(text)}


def _report(ctx, part: int) -> dict:
    rows = [{"row": i, "part": part, "status": "ok", "note": f"reading {i} of part {part} is nominal"}
            for i in range(60)]
    rows[17] = {"row": 17, "part": part, "status": "ERROR", "note": "pressure anomaly detected"}
    return {"part": part, "rows": rows}


NOTES = Scenario(name="notes", title="Notes", description="Write notes.", system_prompt="You write notes.",
                 tools=(Tool("save_note", "Save a long note.", object_schema(
                     {"title": {"type": "string"}, "text": {"type": "string"}}, ["title", "text"]), _save_note),),
                 starter_questions=(), summarize=lambda: {})
PLANT = Scenario(name="plant", title="Plant", description="Five reports.", system_prompt="You check the plant.",
                 tools=(Tool("report", "A long report of one part of the plant.",
                             object_schema({"part": {"type": "integer"}}, ["part"]), _report), READ_ARTIFACT),
                 starter_questions=(), summarize=lambda: {})


def _settings(tmp_path, llm: str, **kw) -> WorkbenchSettings:
    return WorkbenchSettings(_env_file=None, llm_base_url=llm, data_dir=tmp_path / "var", llm_timeout_s=300,
                             llm_temperature=0.0, **kw)


def _requests(client, session_id: str) -> list[dict]:
    spans = client.get(f"/api/sessions/{session_id}/trace").json()["spans"]
    return [s for s in spans if s["kind"] == "model"]


@pytest.fixture(scope="module")
def small_context(tmp_path_factory):
    with real_backends(tmp_path_factory.mktemp("small-model"), ["--parallel", "1", "--ctx-size", "2048"],
                       incident=False) as urls:
        yield urls


def test_a_call_cut_by_max_tokens_is_retried_and_never_sent_back(small_context, tmp_path):
    settings = _settings(tmp_path, small_context["llm"], llm_max_tokens=12, step_budget=3)
    with workbench_client(settings, ScenarioCatalog([NOTES])) as client:
        session = new_session(client, "notes")
        events = post_turn(client, session["id"], "Write a long note about the lighthouse keeper's day.",
                           tool_choice={"type": "function", "function": {"name": "save_note"}})
        assert events[-1]["type"] == "final", events[-1]
        calls = _requests(client, session["id"])
        assert calls[0]["response"]["finish_reason"] == "length", "12 tokens cut the call"
        (retry,) = of_type(events, "retry")
        assert calls[1]["request"]["max_tokens"] > calls[0]["request"]["max_tokens"] == 12
        cut_ids = {c["id"] for c in calls[0]["response"]["message"].get("tool_calls") or []}
        assert not cut_ids & {e["tool_call_id"] for e in of_type(events, "tool_result")}, "the cut call never ran"
        if events[-1]["outcome"] == "tool_call_cut":
            assert "max_tokens" in events[-1]["content"] and not of_type(events, "tool_result")

        later = post_turn(client, session["id"], "Thanks. Say hello.")
        assert later[-1]["type"] == "final", later[-1]  # the server accepted the history
        for call in _requests(client, session["id"]):
            for message in call["request"]["messages"]:
                for tc in message.get("tool_calls") or []:
                    assert isinstance(json.loads(tc["function"]["arguments"]), dict), tc


@contextmanager
def _first_step_scripted(upstream: str, reply: ScriptedReply) -> Iterator[str]:
    """A server that answers the first chat request with `reply` and passes every other request
    (and every other path) to `upstream` (an OpenAI base URL ending in /v1)."""
    root = upstream.removesuffix("/v1")
    app = FastAPI()
    state = {"scripted": False}

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def relay(path: str, request: Request):
        body = await request.body()
        if path == "v1/chat/completions" and not state["scripted"]:
            state["scripted"] = True
            prompt = max(1, len(body) // 4)
            return StreamingResponse(iter(_stream(reply, _extras(prompt, reply), True)), media_type="text/event-stream")
        client = httpx.AsyncClient(timeout=600)
        upstream_request = client.build_request(request.method, f"{root}/{path}", content=body,
                                                headers={"content-type": request.headers.get("content-type", "")})
        answer = await client.send(upstream_request, stream=True)
        if "text/event-stream" in answer.headers.get("content-type", ""):
            async def chunks():
                try:
                    async for chunk in answer.aiter_raw():
                        yield chunk
                finally:
                    await answer.aclose()
                    await client.aclose()
            return StreamingResponse(chunks(), status_code=answer.status_code, media_type="text/event-stream")
        content = await answer.aread()
        await client.aclose()
        return Response(content, status_code=answer.status_code, media_type=answer.headers.get("content-type"))

    with live_server(app) as url:
        yield f"{url}/v1"


def test_five_long_results_of_one_step_fit_the_real_servers_context(small_context, tmp_path):
    first = ScriptedReply(tool_calls=[tool_call("report", {"part": p}, f"r{p}") for p in range(5)])
    with _first_step_scripted(small_context["llm"], first) as llm:
        settings = _settings(tmp_path, llm, llm_max_tokens=128, step_budget=2, tool_result_max_chars=4000)
        with workbench_client(settings, ScenarioCatalog([PLANT])) as client:
            session = new_session(client, "plant")
            events = post_turn(client, session["id"], "Check all five parts of the plant.", force_tool=True)
            assert events[-1]["type"] == "final", events[-1]
            assert {e["tool_call_id"] for e in of_type(events, "tool_result") if e.get("fitted")} == \
                {f"r{p}" for p in range(5)}
            calls = _requests(client, session["id"])
            assert all(c["status"] != "error" for c in calls), [c.get("error") for c in calls]
            answered = calls[-1]
            assert answered["attributes"]["gen_ai.usage.input_tokens"] + answered["request"]["max_tokens"] <= 2048
            assert answered["request"]["max_tokens"] == 128, "a full answer's room is left"
