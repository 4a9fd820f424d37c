"""OTLP export of the workbench's spans (app/telemetry/otlp.py) to a real OTLP/HTTP receiver
(tests/fakes/otlp_collector.py) started by the test: one trace per turn, its model calls, tool
calls and the graph's run, the model request's traceparent naming the model call's span; off
without the standard variables; an unreachable collector costs a turn nothing, and what it
did not take is counted."""

from __future__ import annotations

import time

import pytest

from app.telemetry import otlp
from tests.app.support import decide, make_settings, new_session, post_turn, workbench_client
from tests.fakes.otlp_collector import OtlpCollector
from tests.fakes.scripted_openai import ScriptedReply, scripted_server, tool_call
from tests.fakes.scripted_openai import free_port as closed_port

PROPOSAL = {"action": "restart_service", "target": "event-api", "reason": "queue stuck"}


@pytest.fixture
def otel_env(monkeypatch):
    def configure(endpoint: str, **more: str) -> None:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        for name, value in more.items():
            monkeypatch.setenv(name, value)
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    return configure


def test_off_without_the_standard_variables(tmp_path, monkeypatch):
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    assert not otlp.configured()
    assert not otlp.configured({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_SDK_DISABLED": "true"})
    assert not otlp.configured({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_TRACES_EXPORTER": "none"})
    assert otlp.configured({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://x/v1/traces"})
    with scripted_server([ScriptedReply(content="hi")]) as fake, \
            workbench_client(make_settings(tmp_path, fake.base_url)) as client:
        assert client.get("/api/health").json()["otlp"] is None
        post_turn(client, new_session(client)["id"], "hello")
        assert "traceparent" not in fake.requests[0]["headers"]


def test_one_trace_per_turn_with_its_model_and_tool_spans(tmp_path, otel_env):
    replies = [ScriptedReply(tool_calls=[tool_call("echo", {"text": "ping"}, "c1"),
                                         tool_call("propose_action", PROPOSAL, "c2")], cached_tokens=3,
                             cache_source="S"),
               ScriptedReply(content="Done.", cached_tokens=40, cache_source="A"),
               ScriptedReply(content="Second turn.", cached_tokens=50, cache_source="A")]
    with OtlpCollector() as collector, scripted_server(replies) as fake:
        otel_env(collector.endpoint, OTEL_SERVICE_NAME="bench-workbench")
        with workbench_client(make_settings(tmp_path, fake.base_url)) as client:
            session = new_session(client)
            paused = post_turn(client, session["id"], "Check the service")
            turn_id = paused[0]["turn_id"]
            rest = decide(client, paused[-1]["approval_id"], True)  # the turn's second segment
            assert rest[-1]["type"] == "final"
            second = post_turn(client, session["id"], "And again?")
            client.get("/api/health")
            trace_id = f"{otlp.turn_trace_id(turn_id):032x}"
            other = f"{otlp.turn_trace_id(second[0]['turn_id']):032x}"

            # both turns' spans (the exporter may send them in separate batches)
            spans = collector.wait_for(lambda s: sum(x["trace_id"] == trace_id for x in s) >= 6
                                       and any(x["trace_id"] == other for x in s))
            health = client.get("/api/health").json()["otlp"]
        turn = [s for s in spans if s["trace_id"] == trace_id]
        names = sorted(s["name"] for s in turn)
        model_name = fake.requests[0]["body"]["model"]
        assert names == sorted([f"chat {model_name}"] * 2 + ["execute_tool echo", "execute_tool propose_action"]
                               + ["invoke_agent agent"] * 2), names
        assert {s["service"] for s in turn} == {"bench-workbench"}
        roots = [s for s in turn if s["name"].startswith("invoke_agent")]
        assert all(r["attributes"]["arbor.turn.id"] == turn_id for r in roots)
        root_ids = {r["span_id"] for r in roots}
        assert all(s["parent_span_id"] in root_ids for s in turn if s not in roots)  # each under its segment's run
        chats = sorted((s for s in turn if s["name"].startswith("chat")), key=lambda s: s["start_ns"])
        assert [c["attributes"]["gen_ai.usage.cache_read.input_tokens"] for c in chats] == [3, 40]
        assert [c["attributes"]["arbor.cache.source"] for c in chats] == ["S", "A"]
        assert all(c["attributes"]["gen_ai.operation.name"] == "chat" for c in chats)
        assert chats[0]["attributes"]["gen_ai.conversation.id"] == session["id"]
        tool = next(s for s in turn if s["name"] == "execute_tool echo")
        assert tool["attributes"]["gen_ai.tool.call.id"] == "c1"
        # the model requests carried the trace context of their span
        sent = [r["headers"]["traceparent"] for r in fake.requests[:2]]
        assert [otlp.parse_traceparent(t) for t in sent] == [
            (int(trace_id, 16), int(c["span_id"], 16)) for c in chats]
        # the next turn is a trace of its own
        assert other != trace_id and any(s["trace_id"] == other for s in spans)
        assert health["dropped"] == 0 and health["exported"] >= 6


def test_an_unreachable_collector_costs_a_turn_nothing_and_drops_are_counted(tmp_path, otel_env):
    otel_env(f"http://127.0.0.1:{closed_port()}", OTEL_EXPORTER_OTLP_TIMEOUT="1", OTEL_BSP_MAX_QUEUE_SIZE="2",
             OTEL_BSP_SCHEDULE_DELAY="5000")
    replies = [ScriptedReply(tool_calls=[tool_call("echo", {"text": str(i)}, f"c{i}") for i in range(4)]),
               ScriptedReply(content="Done.")]
    with scripted_server(replies) as fake, workbench_client(make_settings(tmp_path, fake.base_url)) as client:
        t0 = time.monotonic()
        events = post_turn(client, new_session(client)["id"], "Check the service")
        assert events[-1]["type"] == "final" and time.monotonic() - t0 < 5
        stats = client.get("/api/health").json()["otlp"]
        assert stats["max_queue"] == 2 and stats["queued"] <= 2
        assert stats["dropped"] >= 5  # 7 spans (4 tools, 2 model calls, the run) into a queue of 2
        workbench = client.app.state.workbench
        assert not workbench.telemetry.flush(timeout_s=0.2) or workbench.telemetry.stats()["exported"] == 0
    final = workbench.telemetry.stats()
    assert final["exported"] == 0 and final["dropped"] == 7 and final["failed_exports"] >= 1
