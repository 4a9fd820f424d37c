"""Signing in with a browser (issue 35, item 1): a page asked for without a session goes to
the sign-in form and, with the operator token, back to where it was going; then a turn runs,
approved by the signed-in operator; signing out closes the pages and the API again."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.fakes.scripted_openai import ScriptedReply, tool_call
from tests.frontend.test_session_page import last_turn, open_new_session, send
from tests.workbench_auth import WORKBENCH_TOKEN

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]


def test_sign_in_run_a_turn_with_an_approval_and_sign_out(browser, workbench, script):
    context = browser.new_context(viewport={"width": 1280, "height": 900})  # no cookie: signed out
    context.set_default_timeout(15_000)
    page = context.new_page()
    try:
        page.goto(workbench.url + "/replay")
        expect(page).to_have_url(re.compile(r"/signin\?next=/replay$"))
        page.get_by_label("Workbench token").fill("not-the-token-at-all")
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("alert")).to_contain_text("not this workbench")

        page.get_by_label("Workbench token").fill(WORKBENCH_TOKEN)
        page.get_by_role("button", name="Sign in").click()
        expect(page).to_have_url(re.compile(r"/replay$"))
        cookie = next(c for c in context.cookies() if c["name"] == "arbor_session")
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"

        proposal = {"action": "restart_service", "target": "edge-event-api", "reason": "queue backlog"}
        script.on("Diagnose", ScriptedReply(tool_calls=[tool_call("propose_action", proposal, "c_prop")]),
                  ScriptedReply(content="The restart was decided by the operator."))
        open_new_session(page, workbench, "Edge incident")
        send(page, "Diagnose the event service")
        page.locator("section.approval").get_by_role("button", name="Approve").click()
        turn = last_turn(page)
        expect(turn).to_have_attribute("data-status", "completed")
        expect(turn.locator(".md.answer")).to_contain_text("The restart was decided by the operator.")
        approvals = workbench.api("GET", "/api/approvals", params={"status": "approved"}).json()
        assert [a["decided_by"] for a in approvals] == ["operator"]

        page.get_by_role("button", name="Sign out").click()
        expect(page).to_have_url(re.compile(r"/signin$"))
        assert page.evaluate("fetch('/api/sessions').then(r => r.status)") == 401
        page.goto(workbench.url + "/cache")
        expect(page).to_have_url(re.compile(r"/signin\?next=/cache$"))
    finally:
        context.close()
