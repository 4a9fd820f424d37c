"""`arbor verify` against a live workbench (uvicorn on a free port) and the scripted model fake."""

import pytest

from app.cli import build_parser, main
from app.main import create_app
from app.scenario_catalog import ScenarioCatalog
from scenarios.scenario import Scenario
from tests.app.support import LAB_TOOLS, live_server, make_settings
from tests.fakes.scripted_openai import ScriptedReply, free_port, scripted_server, tool_call
from tests.workbench_auth import AUTH_HEADERS
from tools.base import Tool, object_schema

STATUS = Tool("status", "Overall status.", object_schema({}), lambda ctx: {"status": "degraded"})
PROPOSE = LAB_TOOLS[-1]


def _catalog() -> ScenarioCatalog:
    plain = Scenario("plain", "Plain", "d", "Plain prompt.", (STATUS,), ("How are things?",), lambda: {"n": 1})
    acting = Scenario("acting", "Acting", "d", "Acting prompt.", (STATUS, PROPOSE), ("Fix it?",), lambda: {"n": 2})
    return ScenarioCatalog([plain, acting])


def _model(body):
    if body.get("tool_choice") == "required":
        if any(t["function"]["name"] == "propose_action" for t in body["tools"]):
            return ScriptedReply(tool_calls=[tool_call("status", {}),
                                             tool_call("propose_action", {"action": "restart_service",
                                                                          "target": "api", "reason": "stuck"})])
        return ScriptedReply(tool_calls=[tool_call("status", {})])
    return ScriptedReply(content="All checked.")


@pytest.mark.usefixtures("workbench_database")
def test_verify_passes_with_chat_and_rejects_proposals(tmp_path, capsys):
    with scripted_server(_model) as fake:
        app = create_app(make_settings(tmp_path, fake.base_url), _catalog())
        with live_server(app) as url:
            code = main(["verify", "--base-url", url, "--chat"])
            out = capsys.readouterr().out
            assert code == 0, out
            assert "FAIL" not in out
            for check in ("health", "scenarios", "data", "session", "request preview", "tool execution", "chat"):
                assert check in out
            assert "1 proposal(s) rejected" in out
            # verify cleans up after itself
            import httpx
            assert httpx.get(f"{url}/api/sessions", headers=AUTH_HEADERS).json() == []
    approvals = [m for b in fake.bodies for m in b["messages"] if m["role"] == "tool" and "rejected" in m["content"]]
    assert approvals, "the rejection reached the model"


@pytest.mark.usefixtures("workbench_database")
def test_verify_fails_when_the_model_backend_is_down(tmp_path, capsys):
    app = create_app(make_settings(tmp_path, f"http://127.0.0.1:{free_port()}/v1", llm_model="m"), _catalog())
    with live_server(app) as url:
        assert main(["verify", "--base-url", url, "--chat"]) == 1
        out = capsys.readouterr().out
        assert "FAIL" in out and "unreachable" in out
        # without --chat an unreachable backend is only a warning
        assert main(["verify", "--base-url", url]) == 0
        assert "WARN" in capsys.readouterr().out


def test_verify_fails_without_a_workbench(capsys):
    assert main(["verify", "--base-url", f"http://127.0.0.1:{free_port()}"]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_parser_has_the_three_commands():
    parser = build_parser()
    assert parser.parse_args(["serve", "--port", "9999"]).port == 9999
    assert parser.parse_args(["verify", "--chat"]).chat is True
    with pytest.raises(SystemExit):
        parser.parse_args(["nonsense"])
    # replay is registered (by app.replay.cli, or as a clear "unavailable" command)
    assert "replay" in parser._subparsers._group_actions[0].choices
