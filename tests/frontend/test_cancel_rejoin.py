"""The Session page in Chromium: Stop cancels the running turn (its model request is closed and
the branch goes on from its last completed turn), and a reload rejoins a running turn: what it
streamed so far, then the rest, live."""

from __future__ import annotations

import time

import pytest
from playwright.sync_api import expect

from tests.fakes.scripted_openai import ScriptedReply
from tests.frontend.test_session_page import last_turn, open_new_session, send

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]


def _words(n: int) -> str:
    return " ".join(f"word{i}" for i in range(n))


def _streamed(page) -> int:
    return int(page.evaluate("document.body.dataset.streamedTokens || '0'"))


def _wait_streamed(page, more_than: int) -> None:
    """Until the page has drawn more than `more_than` streamed tokens (wait_for_function needs
    eval, which the page's Content-Security-Policy forbids)."""
    deadline = time.monotonic() + 30
    while _streamed(page) <= more_than:
        assert time.monotonic() < deadline, f"no more than {more_than} tokens streamed within 30 s"
        time.sleep(0.05)


def test_stop_cancels_the_running_turn_and_the_branch_stays_usable(page, workbench, script):
    script.on("long story", ScriptedReply(content=_words(400), token_delay_s=0.05))  # 20 s unless stopped
    script.on("short one", ScriptedReply(content="A short answer."))
    open_new_session(page, workbench, "Field maintenance")
    stop = page.get_by_role("button", name="Stop")
    expect(stop).to_be_hidden()
    send(page, "long story")
    expect(stop).to_be_visible()
    _wait_streamed(page, 2)
    stop.click()

    turn = last_turn(page)
    expect(turn).to_have_attribute("data-status", "cancelled")
    expect(turn.locator(".turn-error")).to_contain_text("You stopped this turn")
    expect(stop).to_be_hidden()
    expect(page.get_by_label("Message")).to_be_enabled()
    deadline = time.monotonic() + 10
    while workbench.fake.aborted < 1:  # the workbench closed the model request mid-stream
        assert time.monotonic() < deadline, "the model request was not closed"
        time.sleep(0.05)
    assert "word399" not in turn.inner_text()

    send(page, "short one")
    expect(last_turn(page)).to_have_attribute("data-status", "completed")
    expect(last_turn(page).locator(".md.answer")).to_have_text("A short answer.")
    expect(page.locator("#conversation > li.turn")).to_have_count(1)  # the stopped turn is off the branch
    sent = [m["content"] for m in workbench.fake.bodies[-1]["messages"] if m["role"] != "system"]
    assert sent == ["short one"]
    expect(page.locator('#turn-tree .tree-node .badge:has-text("stopped")')).to_have_count(1)
    assert page.js_errors == []


def test_a_reload_rejoins_the_running_turn_and_follows_it_to_the_end(page, workbench, script):
    script.on("slow answer", ScriptedReply(content=_words(120), token_delay_s=0.05))  # about 6 s
    open_new_session(page, workbench, "Field maintenance")
    send(page, "slow answer")
    _wait_streamed(page, 4)
    page.reload()

    turn = last_turn(page)
    # the replay starts at the turn's first event: the words streamed before the reload are back
    expect(turn.locator(".md.streaming")).to_contain_text("word0 word1 word2 word3")
    assert page.evaluate("document.body.dataset.lastEvents").split(",")[0] == "turn"
    expect(page.get_by_role("button", name="Stop")).to_be_visible()
    _wait_streamed(page, _streamed(page))  # and it goes on live
    expect(turn).to_have_attribute("data-status", "completed", timeout=30_000)
    expect(turn.locator(".md.answer")).to_contain_text("word119")
    assert len(workbench.fake.bodies) == 1  # rejoining never ran the turn again
    assert page.js_errors == []
