"""story_writer through the workbench with the scripted fake: search, approval, a growing book."""

import pytest

from app.scenario_catalog import ScenarioCatalog
from scenarios.story_writer.scenario import SCENARIO
from tests.app.support import decide, make_settings, new_session, of_type, post_turn, workbench_client
from tests.fakes.scripted_openai import ScriptedReply, scripted_server, tool_call

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
        chapters_dir = settings.data_dir / "workspace" / "story_writer" / "chapters"
        with workbench_client(settings, ScenarioCatalog()) as client:
            session = new_session(client, "story_writer")
            events = post_turn(client, session["id"], "写第三章")
            request = events[-1]
            assert request["type"] == "approval_request" and request["arguments"] == CHAPTER
            assert not chapters_dir.exists()  # nothing written on the model's word

            rest = decide(client, request["approval_id"], approved)
            results = {e["name"]: e for e in of_type(rest, "tool_result")}
            assert "一九八七年" in results["search_manuscript"]["content"]
            if approved:
                assert '"appended_chapter":3' in results["append_chapter"]["content"]
                assert (chapters_dir / "03.md").read_text(encoding="utf-8") == (
                    "# 第三章 来客\n\n雾夜。苏晚敲响了灯塔的铁门。\n")
            else:
                assert "operator rejected" in results["append_chapter"]["content"]
                assert not chapters_dir.exists()

            second = post_turn(client, session["id"], "现在有几章？")
            listing = of_type(second, "tool_result")[0]["content"]
            assert ('"number":3' in listing) is approved

    # every request of both turns starts with the same system prompt: the whole manuscript
    systems = [body["messages"][0] for body in fake.bodies]
    assert len(systems) == 4
    assert all(s == {"role": "system", "content": SCENARIO.system_prompt} for s in systems)
    assert "三长一短" in SCENARIO.system_prompt
