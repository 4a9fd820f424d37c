"""story_writer through the workbench with the scripted fake: search, approval, a growing book."""

import json
import re

import pytest

from app.scenario_catalog import ScenarioCatalog
from scenarios.story_writer.scenario import LIBRARY, SCENARIO
from tests.app.support import decide, make_settings, new_session, of_type, post_turn, workbench_client
from tests.fakes.scripted_openai import ScriptedReply, scripted_server, tool_call

pytestmark = pytest.mark.usefixtures("workbench_database")  # each test on SQLite and PostgreSQL

CHAPTER = {"title": "第三章 来客", "text": "雾夜。苏晚敲响了灯塔的铁门。"}


def _script():
    return [ScriptedReply(tool_calls=[tool_call("search_manuscript", {"query": "海燕号"}, "c1"),
                                      tool_call("append_chapter", CHAPTER, "c2")]),
            ScriptedReply(content="第三章已提交。"),
            ScriptedReply(tool_calls=[tool_call("list_chapters", {}, "c3")]),
            ScriptedReply(content="书稿现在有三章。")]


@pytest.mark.parametrize("approved", [True, False])
def test_chapter_is_appended_only_after_approval(tmp_path, approved):
    with scripted_server(_script()) as fake:
        settings = make_settings(tmp_path, fake.base_url, tool_result_max_chars=4000)
        with workbench_client(settings, ScenarioCatalog()) as client:
            session = new_session(client, "story_writer")
            files = f"/api/sessions/{session['id']}/branches/{session['active_branch_id']}/files"
            events = post_turn(client, session["id"], "写第三章")
            request = events[-1]
            assert request["type"] == "approval_request" and request["arguments"] == CHAPTER
            assert client.get(files).json() == []  # nothing written on the model's word

            rest = decide(client, request["approval_id"], approved)
            results = {e["name"]: e for e in of_type(rest, "tool_result")}
            assert "一九八七年" in results["search_manuscript"]["content"]
            if approved:
                assert '"appended_chapter":3' in results["append_chapter"]["content"]
                [saved] = client.get(files, params={"content": True}).json()
                assert saved["path"] == "story_writer/chapters/03.md" and saved["turn_id"] == request["turn_id"]
                assert saved["content"] == "# 第三章 来客\n\n雾夜。苏晚敲响了灯塔的铁门。\n"
            else:
                assert "operator rejected" in results["append_chapter"]["content"]
                assert client.get(files).json() == []
            assert not (settings.data_dir / "workspace").exists()  # nothing goes to the filesystem

            second = post_turn(client, session["id"], "现在有几章？")
            listing = of_type(second, "tool_result")[0]["content"]
            assert ('"number":3' in listing) is approved

    # every request of both turns starts with the same system prompt: the whole manuscript
    systems = [body["messages"][0] for body in fake.bodies]
    assert len(systems) == 4
    assert all(s == {"role": "system", "content": SCENARIO.system_prompt} for s in systems)
    assert "三长一短" in SCENARIO.system_prompt


def test_trimmed_chapter_is_read_back_through_read_artifact(tmp_path):
    """A chapter too long for the tool budget is trimmed; the model pages it back by id, and
    an id of another session is refused."""
    def reply(body):
        tools = [m for m in body["messages"] if m["role"] == "tool"]
        if not tools:
            return ScriptedReply(tool_calls=[tool_call("read_chapter", {"number": 1}, "c1")])
        if len(tools) == 1:
            artifact_id = re.search(r"kept as artifact (\w+)\]", tools[0]["content"]).group(1)
            return ScriptedReply(tool_calls=[tool_call("read_artifact", {"artifact_id": artifact_id}, "c2"),
                                             tool_call("read_artifact", {"artifact_id": "elsewhere"}, "c3")])
        return ScriptedReply(content="读完了。")

    with scripted_server(reply) as fake:
        settings = make_settings(tmp_path, fake.base_url, tool_result_max_chars=200, tool_result_max_tokens=50)
        with workbench_client(settings, ScenarioCatalog()) as client:
            session = new_session(client, "story_writer")
            events = post_turn(client, session["id"], "读第一章")
    # calls of one step run in parallel and report as they finish: put them in call order
    results = sorted(of_type(events, "tool_result"), key=lambda r: r["tool_call_id"])
    assert [r["name"] for r in results] == ["read_chapter", "read_artifact", "read_artifact"]
    assert results[0]["trimmed"] and results[0]["artifact_id"]
    page = json.loads(results[1]["content"])  # the page fits the budget: not trimmed again
    assert not results[1]["trimmed"] and len(results[1]["content"]) <= 200
    full = json.dumps({"number": 1, "title": "第一章 雾港", "text": LIBRARY.shipped_chapters()[0].text},
                      ensure_ascii=False, separators=(",", ":"))
    assert page["artifact_id"] == results[0]["artifact_id"] and page["total_chars"] == len(full)
    assert page["offset"] == 0 and page["text"] and full.startswith(page["text"])
    assert page["next_offset"] == len(page["text"])
    assert results[2]["error"] and "no artifact 'elsewhere' in this session" in results[2]["error"]
    assert events[-1]["type"] == "final"
