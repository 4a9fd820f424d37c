"""The Session page in Chromium: streamed answers, tool cards, forks and branch switches, approvals."""

from __future__ import annotations

import re
import time

import pytest
from playwright.sync_api import expect

from tests.fakes.scripted_openai import ScriptedReply, tool_call

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]


def open_new_session(page, workbench, scenario_title: str) -> str:
    """From the home page, start a session of the scenario titled `scenario_title`."""
    page.goto(workbench.url + "/")
    card = page.locator("article.scenario", has=page.get_by_role("heading", name=scenario_title))
    card.get_by_role("button", name="New session").click()
    page.wait_for_url(re.compile(r"/sessions/[0-9a-f]+$"))
    expect(page.locator("#session-title")).to_contain_text(scenario_title)
    return page.url.rsplit("/", 1)[1]


def send(page, text: str) -> None:
    page.get_by_label("Message").fill(text)
    page.get_by_role("button", name="Send").click()


def last_turn(page):
    return page.locator("#conversation > li.turn").last


def test_message_streams_an_answer_and_shows_the_tool_card(page, workbench, script):
    script.on("Which companies",
              ScriptedReply(tool_calls=[tool_call("list_companies", {}, "call_list")]),
              ScriptedReply(content="There are **three** companies:\n\n- Northwind Robotics\n- Cedar Grid Energy\n"
                                    "- Lumen Bay Health", cached_tokens=40, cache_source="S"))
    open_new_session(page, workbench, "Financial research")
    send(page, "Which companies are covered?")

    turn = last_turn(page)
    expect(turn).to_have_attribute("data-status", "completed")
    answer = turn.locator(".md.answer")
    expect(answer).to_contain_text("There are three companies")
    expect(answer.locator("strong")).to_have_text("three")
    expect(answer.locator("li")).to_have_count(3)
    # the answer arrived as SSE token events, parsed from the fetch body stream
    assert int(page.evaluate("document.body.dataset.streamedTokens")) > 1
    events = page.evaluate("document.body.dataset.lastEvents").split(",")
    assert events[0] == "turn" and events[-1] == "final"
    assert {"token", "tool_call", "tool_result", "model_call"} <= set(events)

    card = turn.locator("article.tool-card")
    expect(card).to_have_count(1)
    expect(card.locator(".tool-name")).to_have_text("list_companies")
    expect(card).to_have_attribute("data-state", "ok")
    expect(card.locator(".tool-result")).to_contain_text("Northwind Robotics")
    expect(card.locator(".duration")).to_contain_text("ms")
    expect(turn.locator(".model-stats")).to_contain_text("2 model calls")
    expect(turn.locator(".model-stats")).to_contain_text("40 reused")
    expect(turn.locator(".model-stats")).to_contain_text("cache S")
    # the page still shows the same after a reload (rendered from the stored turn)
    page.reload()
    expect(last_turn(page).locator("article.tool-card .tool-name")).to_have_text("list_companies")
    expect(last_turn(page).locator(".md.answer strong")).to_have_text("three")
    assert page.js_errors == []


def test_a_thinking_models_reasoning_is_shown_collapsed_per_step_and_sent_back(page, workbench, script):
    script.on("Which companies",
              ScriptedReply(reasoning="I should list the companies first.",
                            tool_calls=[tool_call("list_companies", {}, "call_list")]),
              ScriptedReply(reasoning="Three rows came back.", content="There are three companies."))
    open_new_session(page, workbench, "Financial research")
    send(page, "Which companies are covered?")

    turn = last_turn(page)
    expect(turn).to_have_attribute("data-status", "completed")
    reasoning = turn.locator("details.reasoning")
    expect(reasoning).to_have_count(2)
    expect(reasoning.first).not_to_have_attribute("open", "")
    expect(reasoning.first.locator(".reasoning-text")).to_have_text("I should list the companies first.")
    expect(reasoning.last.locator(".reasoning-text")).to_have_text("Three rows came back.")
    expect(turn.locator(".md.answer")).to_have_text("There are three companies.")
    reasoning.first.locator("summary").click()
    expect(reasoning.first.locator(".reasoning-text")).to_be_visible()
    # the second model call got the first step's reasoning back with its history
    second = [b for b in workbench.fake.bodies if any(m.get("role") == "tool" for m in b["messages"])][0]
    step = next(m for m in second["messages"] if m.get("tool_calls"))
    assert step["reasoning_content"] == "I should list the companies first."
    assert page.js_errors == []


def test_an_older_load_answered_late_does_not_undo_a_newer_one(page, workbench, script):
    """Two loads of the session overlap (here two quick forks; in use, a turn's end and a fork): the first
    one's answer, taken before the second fork, is delivered after the second load rendered. The page keeps
    the newer state; rendering the late answer would drop the second fork from the branch list."""
    script.on("first question", ScriptedReply(content="Answer one."))
    session_id = open_new_session(page, workbench, "Field maintenance")
    send(page, "first question")
    expect(last_turn(page)).to_have_attribute("data-status", "completed")
    branches = page.locator("#branch-list > li.branch")
    expect(branches).to_have_count(1)

    held = []

    def hold_the_first_load(route):
        if route.request.method == "GET" and not held:
            held.append((route, route.fetch()))  # answered now (two branches), delivered later
            return
        route.continue_()

    page.route(re.compile(rf".*/api/sessions/{session_id}$"), hold_the_first_load)
    fork_button = page.locator("#conversation > li.turn").first.get_by_role(
        "button", name=re.compile("Fork a new branch from turn #1"))
    fork_button.click()
    deadline = time.monotonic() + 10
    while not held and time.monotonic() < deadline:
        page.wait_for_timeout(50)
    assert held, "the first fork's load never asked for the session"
    fork_button.click()
    expect(branches).to_have_count(3)

    route, answer = held[0]
    route.fulfill(response=answer)
    page.wait_for_timeout(500)  # the late answer's load runs its course (its trace request included)
    expect(branches).to_have_count(3)


def test_fork_from_first_turn_and_switch_between_branches(page, workbench, script):
    script.on("first question", ScriptedReply(content="Answer one."))
    script.on("second question", ScriptedReply(content="Answer two on main."))
    script.on("other path", ScriptedReply(content="Answer on the fork."))
    open_new_session(page, workbench, "Field maintenance")
    send(page, "first question")
    expect(last_turn(page)).to_contain_text("Answer one.")
    send(page, "second question")
    expect(page.locator("#conversation > li.turn")).to_have_count(2)
    expect(last_turn(page)).to_contain_text("Answer two on main.")

    first_turn = page.locator("#conversation > li.turn").first
    first_turn.get_by_role("button", name=re.compile("Fork a new branch from turn #1")).click()
    branches = page.locator("#branch-list > li.branch")
    expect(branches).to_have_count(2)
    current = page.locator("#branch-list > li.branch.current")
    expect(current).not_to_have_attribute("data-branch-name", "main")
    expect(page.locator("#conversation > li.turn")).to_have_count(1)
    expect(page.locator("#conversation")).not_to_contain_text("second question")

    send(page, "other path please")
    expect(page.locator("#conversation > li.turn")).to_have_count(2)
    expect(last_turn(page)).to_contain_text("Answer on the fork.")
    main = page.locator("#branch-list > li.branch[data-branch-name='main']")
    expect(main).to_contain_text("shares 1 turn with the current branch, diverges after #1")
    # the tree shows the fork point with both continuations below it
    fork_node = page.locator("#turn-tree li.tree-node", has_text="first question").first
    expect(fork_node.locator(".tag.fork-point").first).to_be_visible()
    expect(fork_node.locator(":scope > ul > li")).to_have_count(2)

    main.get_by_role("button", name="Switch to branch main").click()
    expect(page.locator("#branch-list > li.branch.current")).to_have_attribute("data-branch-name", "main")
    expect(page.locator("#current-branch-name")).to_have_text("main")
    turns = page.locator("#conversation > li.turn")
    expect(turns).to_have_count(2)
    expect(turns.nth(1)).to_contain_text("second question")
    expect(page.locator("#conversation")).not_to_contain_text("other path please")
    # the fork's request history shared the first turn: the model saw turn 1, not turn 2
    fork_body = next(b for b in workbench.fake.bodies if "other path please" in str(b["messages"][-1]))
    seen = " ".join(str(m.get("content")) for m in fork_body["messages"])
    assert "first question" in seen and "second question" not in seen
    assert page.js_errors == []


def test_delete_a_branch_and_be_told_why_not(page, workbench, script):
    script.on("first question", ScriptedReply(content="Answer one."))
    script.on("on the fork", ScriptedReply(content="Answer on the fork."))
    open_new_session(page, workbench, "Field maintenance")
    send(page, "first question")
    expect(last_turn(page)).to_contain_text("Answer one.")
    first_turn = page.locator("#conversation > li.turn").first
    first_turn.get_by_role("button", name=re.compile("Fork a new branch from turn #1")).click()
    branches = page.locator("#branch-list > li.branch")
    expect(branches).to_have_count(2)
    send(page, "on the fork")
    expect(last_turn(page)).to_contain_text("Answer on the fork.")
    fork_name = page.locator("#branch-list > li.branch.current").get_attribute("data-branch-name")
    last_turn(page).get_by_role("button", name=re.compile("Fork a new branch from turn #2")).click()
    expect(branches).to_have_count(3)
    grandchild = page.locator("#branch-list > li.branch.current").get_attribute("data-branch-name")
    main = page.locator("#branch-list > li.branch[data-branch-name='main']")
    expect(main.get_by_role("button", name=re.compile("Delete"))).to_have_count(0)  # the root stays

    page.on("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name=f"Delete branch {fork_name}").click()
    expect(page.locator("#session-error")).to_contain_text(
        f"Could not delete branch {fork_name}: branch '{fork_name}' has branches forked from it ('{grandchild}')")
    expect(branches).to_have_count(3)

    page.get_by_role("button", name=f"Delete branch {grandchild}").click()
    expect(branches).to_have_count(2)
    page.get_by_role("button", name=f"Delete branch {fork_name}").click()
    expect(branches).to_have_count(1)
    expect(page.locator("#branch-list > li.branch.current")).to_have_attribute("data-branch-name", "main")
    expect(page.locator("#conversation > li.turn")).to_have_count(1)
    assert page.js_errors == []


def test_fork_inside_a_turn_before_the_tool_result_and_continue_it(page, workbench, script):
    script.on("Which companies",
              ScriptedReply(tool_calls=[tool_call("list_companies", {}, "call_list")]),
              ScriptedReply(content="Three companies are covered."))
    open_new_session(page, workbench, "Financial research")
    send(page, "Which companies are covered?")
    expect(last_turn(page)).to_have_attribute("data-status", "completed")

    current = page.locator("#branch-list > li.branch.current")
    current.locator("details.checkpoints summary").click()
    point = current.locator("li.checkpoint", has_text="assistant calls list_companies · next: tools")
    expect(point).to_have_count(1)
    point.get_by_role("button", name=re.compile("Fork from checkpoint")).click()
    expect(page.locator("#branch-list > li.branch")).to_have_count(2)
    expect(page.locator("#branch-list > li.branch.current")).to_contain_text("forked inside turn #1")
    expect(page.get_by_label("Message")).to_be_disabled()

    page.get_by_role("button", name="Continue turn #1").click()
    turn = last_turn(page)
    expect(turn).to_have_attribute("data-status", "completed")
    expect(turn.locator(".md.answer")).to_contain_text("Three companies are covered.")
    expect(turn.locator("article.tool-card .tool-name")).to_have_text("list_companies")
    expect(page.get_by_label("Message")).to_be_enabled()
    assert page.js_errors == []


def _pins(workbench, session_id: str) -> list[tuple[str, bool]]:
    """(branch id, pin) of the bare pin hints the workbench sent for the session, in order."""
    return [(h["session"].split("/", 1)[1], h["pin"]) for h in list(workbench.fake.hints)
            if h["session"].startswith(session_id + "/") and "pin" in h and "state" not in h]


def _wait_for_pins(workbench, session_id: str, expected: list[tuple[str, bool]]) -> None:
    deadline = time.monotonic() + 10  # the page reports without waiting for the answer
    while _pins(workbench, session_id) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _pins(workbench, session_id) == expected


def test_the_page_pins_the_branch_it_shows(page, workbench, script):
    script.on("first question", ScriptedReply(content="Answer one."))
    session_id = open_new_session(page, workbench, "Field maintenance")
    main_id = workbench.api("GET", f"/api/sessions/{session_id}").json()["active_branch_id"]
    _wait_for_pins(workbench, session_id, [(main_id, True)])
    send(page, "first question")
    expect(last_turn(page)).to_contain_text("Answer one.")
    page.locator("#conversation > li.turn").first.get_by_role("button", name=re.compile("Fork a new branch")).click()
    expect(page.locator("#branch-list > li.branch")).to_have_count(2)
    fork_id = workbench.api("GET", f"/api/sessions/{session_id}").json()["active_branch_id"]
    assert fork_id != main_id
    _wait_for_pins(workbench, session_id, [(main_id, True), (main_id, False), (fork_id, True)])
    page.get_by_role("button", name="Switch to branch main").click()
    expect(page.locator("#current-branch-name")).to_have_text("main")
    _wait_for_pins(workbench, session_id, [(main_id, True), (main_id, False), (fork_id, True),
                                           (fork_id, False), (main_id, True)])
    assert page.js_errors == []


def test_approve_a_proposed_action(page, workbench, script):
    proposal = {"action": "restart_service", "target": "edge-event-api", "reason": "queue backlog keeps growing"}
    script.on("Diagnose",
              ScriptedReply(tool_calls=[tool_call("service_status", {}, "c_status"),
                                        tool_call("propose_action", proposal, "c_prop")]),
              ScriptedReply(content="Diagnosis: the service is degraded. The restart was decided by the operator."))
    open_new_session(page, workbench, "Edge incident")
    send(page, "Diagnose the event service")

    box = page.locator("section.approval")
    expect(box).to_be_visible()
    expect(box).to_contain_text("propose_action")
    expect(box).to_contain_text("queue backlog keeps growing")
    expect(page.get_by_label("Message")).to_be_disabled()
    expect(last_turn(page)).to_have_attribute("data-status", "awaiting_approval")
    box.get_by_label("Comment").fill("ok, restart it")
    box.get_by_role("button", name="Approve").click()

    turn = last_turn(page)
    expect(turn).to_have_attribute("data-status", "completed")
    expect(turn.locator(".md.answer")).to_contain_text("Diagnosis: the service is degraded.")
    status_card = turn.locator("article.tool-card[data-tool='service_status']")
    expect(status_card).to_have_attribute("data-state", "ok")
    expect(status_card.locator(".tool-result")).to_contain_text("degraded")
    proposal_card = turn.locator("article.tool-card[data-tool='propose_action']")
    expect(proposal_card).to_contain_text("operator approved")
    expect(page.locator("section.approval")).to_have_count(0)
    expect(page.get_by_label("Message")).to_be_enabled()

    approvals = workbench.api("GET", "/api/approvals", params={"status": ""}).json()
    assert [(a["status"], a["comment"]) for a in approvals] == [("approved", "ok, restart it")]
    assert page.js_errors == []


def test_failed_turn_shows_the_error_and_retry_works(page, workbench, script):
    script.on_call("flaky", lambda attempt, body: ScriptedReply(status=503) if attempt == 0
                   else ScriptedReply(content="Second time lucky."))
    open_new_session(page, workbench, "Financial research")
    send(page, "flaky question")
    failed = page.locator("#conversation > li.turn[data-status='failed']")
    expect(failed).to_have_count(1)
    expect(failed.locator(".turn-error")).to_contain_text("failed")
    failed.get_by_role("button", name="Retry this message").click()
    done = page.locator("#conversation > li.turn[data-status='completed']")
    expect(done).to_have_count(1)
    expect(done).to_contain_text("Second time lucky.")
    assert page.js_errors == []


def test_keyboard_alone_starts_a_session_and_sends(page, workbench, script):
    script.on("keyboard", ScriptedReply(content="Typed without a mouse."))
    page.goto(workbench.url + "/")
    for _ in range(40):
        page.keyboard.press("Tab")
        focused = page.evaluate("[document.activeElement.className, document.activeElement.textContent]")
        if "new-session" in focused[0]:
            break
    else:
        pytest.fail("no New session button reachable with Tab")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r"/sessions/[0-9a-f]+$"))
    page.get_by_label("Message").focus()
    page.keyboard.type("keyboard only")
    page.keyboard.press("Control+Enter")
    expect(last_turn(page)).to_contain_text("Typed without a mouse.")
    # the page has finished the turn (Stop gone, the page reloaded, Send enabled again) before
    # focus moves: Tab while it redraws could land on an element it then removes
    expect(page.locator("#stop")).to_be_hidden()
    expect(page.locator("#send")).to_be_enabled()
    page.get_by_label("Message").focus()
    # focus is visible: the focused button draws an outline
    page.keyboard.press("Tab")
    outline = page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    assert outline != "none"


def test_a_message_sent_while_the_page_still_loads_is_sent_once_it_has_loaded(page, workbench, script):
    """Ctrl+Enter before the session detail has arrived (CI saw it: a slow first load) waits for
    it instead of failing on a page that does not yet know its branch."""
    script.on("early bird", ScriptedReply(content="Sent after the page loaded."))
    held = []
    detail = re.compile(r"/api/sessions/[0-9a-f]+$")
    page.route(detail, lambda route: held.append(route))
    page.goto(workbench.url + "/")
    card = page.locator("article.scenario[data-scenario='financial_research']")
    card.get_by_role("button", name="New session").click()
    page.wait_for_url(re.compile(r"/sessions/[0-9a-f]+$"))
    page.wait_for_function("document.readyState === 'complete'")
    expect(page.locator("#send")).to_be_disabled()  # nothing to send to yet
    page.get_by_label("Message").fill("early bird")
    page.get_by_label("Message").press("Control+Enter")
    page.wait_for_timeout(200)
    assert len(held) == 1 and page.locator("#conversation > li.turn").count() == 0
    held[0].continue_()
    page.unroute(detail)  # the reload after the turn goes through
    expect(last_turn(page)).to_contain_text("Sent after the page loaded.")
    assert page.js_errors == []


def test_unknown_session_says_so(page, workbench):
    page.goto(workbench.url + "/sessions/does-not-exist")
    expect(page.locator("#session-error")).to_contain_text("does not exist")


def test_refused_message_is_explained_and_kept(page, workbench):
    page.goto(workbench.url + "/")
    scenario = page.locator("article.scenario[data-scenario='field_maintenance']")
    scenario.get_by_role("button", name="New session").click()
    page.wait_for_url(re.compile(r"/sessions/[0-9a-f]+$"))
    too_long = "x" * (workbench.settings.max_message_chars + 1)
    page.get_by_label("Message").fill(too_long)
    page.get_by_role("button", name="Send").click()
    expect(page.locator("#session-error")).to_contain_text("Not sent")
    expect(page.locator("#session-error")).to_contain_text(str(workbench.settings.max_message_chars))
    expect(page.get_by_label("Message")).to_have_value(too_long)
    expect(page.locator("#conversation > li.turn")).to_have_count(0)
    assert workbench.fake.requests == []
