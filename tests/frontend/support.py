"""Helpers for the browser tests: a scripted conversation, the live workbench, the incident service."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import uvicorn

from app.main import create_app
from app.settings import WorkbenchSettings
from tests.fakes.scripted_openai import ScriptedOpenAI, ScriptedReply, free_port
from tests.workbench_auth import AUTH_HEADERS

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]
REPO = Path(__file__).resolve().parents[2]

Rule = list[ScriptedReply] | Callable[[int, dict], ScriptedReply]


@dataclass
class ConversationScript:
    """Replies chosen by the latest user message, so tests do not depend on request order.

    `on(keyword, reply_for_step_1, reply_for_step_2, ...)`: a user message containing
    `keyword` gets these replies, one per model step of its turn (the step is the number of
    assistant messages after that user message). A message no rule matches is answered with
    HTTP 500 naming it, so an unscripted request fails loudly.
    """

    rules: dict[str, Rule] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)

    def on(self, keyword: str, *replies: ScriptedReply) -> ConversationScript:
        self.rules[keyword] = list(replies)
        return self

    def on_call(self, keyword: str, choose: Callable[[int, dict], ScriptedReply]) -> ConversationScript:
        """`choose(attempt, body)`: attempt counts every request for this keyword from 0."""
        self.rules[keyword] = choose
        return self

    def __call__(self, body: dict) -> ScriptedReply:
        messages = body.get("messages", [])
        users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
        if not users:
            return ScriptedReply(status=500)
        text = str(messages[users[-1]].get("content"))
        step = sum(1 for m in messages[users[-1] + 1:] if m.get("role") == "assistant")
        for keyword, rule in self.rules.items():
            if keyword in text:
                attempt = self.calls.get(keyword, 0)
                self.calls[keyword] = attempt + 1
                if callable(rule):
                    return rule(attempt, body)
                return rule[min(step, len(rule) - 1)]
        return ScriptedReply(status=500, content=f"unscripted message {text!r}")


@contextlib.contextmanager
def serve(app, name: str) -> Iterator[str]:
    """Run an ASGI app with uvicorn in a thread on a free loopback port; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name=name, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError(f"{name} did not start on port {port}")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)


@contextlib.contextmanager
def incident_service(state: str = "degraded") -> Iterator[str]:
    """The simulated incident service as its own process (`python -m scenarios.edge_incident.service`)."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen([sys.executable, "-m", "scenarios.edge_incident.service", "--state", state,
                                "--port", str(port)], cwd=REPO, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert process.stderr is not None  # a pipe
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{url}/status", timeout=1.0)
                break
            except httpx.HTTPError:
                if process.poll() is not None:
                    raise RuntimeError(f"incident service exited: {process.stderr.read().decode()[-2000:]}") from None
                if time.monotonic() > deadline:
                    raise RuntimeError("incident service did not start") from None
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


@dataclass
class LiveWorkbench:
    url: str
    fake: ScriptedOpenAI
    script: ConversationScript
    settings: WorkbenchSettings

    def api(self, method: str, path: str, **kwargs) -> httpx.Response:
        headers = {**AUTH_HEADERS, **kwargs.pop("headers", {})}
        return httpx.request(method, f"{self.url}{path}", timeout=30, headers=headers, **kwargs)

    def new_session(self, scenario: str) -> dict:
        response = self.api("POST", "/api/sessions", json={"scenario": scenario})
        assert response.status_code == 201, response.text
        return response.json()

    def run_turn(self, session_id: str, message: str, **fields) -> dict:
        """A turn through the API (stream off), for tests whose subject is another page."""
        response = self.api("POST", f"/api/sessions/{session_id}/turns",
                            json={"message": message, "stream": False, **fields})
        assert response.status_code == 200, response.text
        return response.json()


@contextlib.contextmanager
def live_workbench(data_dir: Path, incident_url: str, script: ConversationScript,
                   extra_fake_routes: Callable[[ScriptedOpenAI], None] | None = None) -> Iterator[LiveWorkbench]:
    """The real workbench app (temp SQLite DB) against the scripted fake over real HTTP."""
    fake = ScriptedOpenAI(script)
    if extra_fake_routes:
        extra_fake_routes(fake)
    fake.start()
    try:
        settings = WorkbenchSettings(_env_file=None, llm_base_url=fake.base_url, llm_model="", data_dir=data_dir,
                                     incident_base_url=incident_url, llm_timeout_s=10.0, step_budget=4)
        with serve(create_app(settings), "workbench") as url:
            yield LiveWorkbench(url, fake, script, settings)
    finally:
        fake.stop()
