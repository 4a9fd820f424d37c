"""One browser test against the real stack: arbor-server on the embedded model, the workbench,
the simulated incident service, and Chromium. A 135M model does not pick tools reliably, so
the first step is forced to call one; the assertions are about structure, not wording."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from app.main import create_app
from app.settings import WorkbenchSettings
from tests.frontend.support import serve
from tests.frontend.test_session_page import last_turn, open_new_session, send

pytestmark = [pytest.mark.browser, pytest.mark.model, pytest.mark.timeout(900)]


def test_a_forced_tool_turn_on_the_embedded_model(page, real_server, incident_url, tmp_path):
    settings = WorkbenchSettings(_env_file=None, llm_base_url=real_server.v1, llm_model="", data_dir=tmp_path / "var",
                                 incident_base_url=incident_url, llm_timeout_s=600.0, llm_max_tokens=64,
                                 llm_temperature=0.0, step_budget=2)
    with serve(create_app(settings), "workbench") as url:
        page.set_default_timeout(600_000)

        class Live:  # what open_new_session needs
            pass

        live = Live()
        live.url = url
        open_new_session(page, live, "Field maintenance")
        page.get_by_label("Require a tool call in the first step").check()
        send(page, "What is the status of the fleet?")
        turn = last_turn(page)
        expect(turn).to_have_attribute("data-status", "completed", timeout=600_000)
        expect(turn.locator('article.tool-card[data-state="ok"]').first).to_be_visible(timeout=30_000)
        expect(turn.locator(".md.answer")).not_to_be_empty()
        assert int(page.evaluate("document.body.dataset.streamedTokens")) > 0
        assert not page.js_errors
