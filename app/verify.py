"""`arbor verify`: check a running workbench end to end over its HTTP API.

Checks, in order: health, scenarios, each scenario's data, sessions, the request preview,
direct tool execution, and (with --chat) one real turn per scenario whose first step is
forced to call a tool: a tool must run and a non-empty final answer come back. A proposed
action met on the way is rejected (verification never approves actions).

Prints a pass/fail table; the exit code is 0 when nothing failed, 1 otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

PASS, FAIL, SKIP, WARN = "PASS", "FAIL", "SKIP", "WARN"


@dataclass
class CheckRow:
    check: str
    target: str
    status: str
    detail: str


@dataclass
class Verifier:
    base_url: str
    chat: bool = False
    timeout_s: float = 600.0
    keep: bool = False
    token: str | None = None  # the workbench's operator token (arbor verify reads ARBOR_DATA_DIR's)
    rows: list[CheckRow] = field(default_factory=list)
    _sessions: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self.http = httpx.Client(base_url=self.base_url.rstrip("/"), timeout=httpx.Timeout(self.timeout_s, connect=5),
                                 headers=headers)

    # -- plumbing ------------------------------------------------------------------------------
    def add(self, check: str, target: str, status: str, detail: str) -> None:
        self.rows.append(CheckRow(check, target, status, detail))

    def attempt(self, check: str, target: str, fn: Callable[[], tuple[str, str]]) -> bool:
        """Run one check; exceptions become a FAIL row with a readable detail."""
        try:
            status, detail = fn()
        except httpx.HTTPError as exc:
            status, detail = FAIL, f"HTTP problem: {type(exc).__name__}: {exc}"
        except (AssertionError, KeyError, ValueError, TypeError) as exc:
            status, detail = FAIL, str(exc) or type(exc).__name__
        self.add(check, target, status, detail)
        return status != FAIL

    def get(self, path: str, **kw: Any) -> Any:
        response = self.http.get(path, **kw)
        _expect(response, 200)
        return response.json()

    def post(self, path: str, body: dict, status: int = 200) -> Any:
        response = self.http.post(path, json=body)
        _expect(response, status)
        return response.json()

    # -- the checks ----------------------------------------------------------------------------
    def run(self) -> int:
        try:
            if not self.attempt("health", "workbench", self.check_health):
                return self.finish()
            scenarios: list[dict] = []

            def list_them() -> tuple[str, str]:
                scenarios.extend(self.get("/api/scenarios"))
                assert scenarios, "the workbench lists no scenarios"
                return PASS, ", ".join(s["name"] for s in scenarios)

            if not self.attempt("scenarios", "list", list_them):
                return self.finish()
            for scenario in scenarios:
                self.verify_scenario(scenario)
        finally:
            self.cleanup()
        return self.finish()

    def check_health(self) -> tuple[str, str]:
        health = self.get("/api/health")
        llm = health.get("llm", {})
        if not llm.get("reachable"):
            detail = f"model backend unreachable: {llm.get('error')}"
            return (FAIL if self.chat else WARN), detail
        return PASS, f"model backend {llm.get('base_url')} serves {', '.join(llm.get('models', []))}"

    def verify_scenario(self, scenario: dict) -> None:
        name = scenario["name"]

        def data() -> tuple[str, str]:
            detail = self.get(f"/api/scenarios/{name}")
            assert detail.get("data"), "the scenario reports no local data"
            assert detail.get("system_prompt"), "the scenario has no system prompt"
            assert detail.get("tools"), "the scenario has no tools"
            return PASS, f"{len(detail['tools'])} tools; data: {_short(detail['data'])}"

        self.attempt("data", name, data)
        session: dict = {}

        def create() -> tuple[str, str]:
            session.update(self.post("/api/sessions", {"scenario": name, "title": "arbor verify"}, status=201))
            self._sessions.append(session["id"])
            again = self.get(f"/api/sessions/{session['id']}")
            assert again["active_branch_id"], "the new session has no branch"
            return PASS, f"session {session['id']}"

        if not self.attempt("session", name, create):
            return
        question = (scenario.get("starter_questions") or ["What can you tell me?"])[0]

        def preview() -> tuple[str, str]:
            body = self.post(f"/api/sessions/{session['id']}/preview",
                             {"message": question, "force_tool": True})["body"]
            roles = [m["role"] for m in body["messages"]]
            assert roles[0] == "system" and roles[-1] == "user", f"unexpected message roles {roles}"
            assert body.get("tools") and body.get("tool_choice") == "required", "tools or tool_choice missing"
            return PASS, f"{len(body['messages'])} messages, {len(body['tools'])} tools, model {body['model']}"

        self.attempt("request preview", name, preview)
        self.attempt("tool execution", name, lambda: self.run_one_tool(scenario))
        if self.chat:
            self.attempt("chat", name, lambda: self.chat_turn(session["id"], question))

    def run_one_tool(self, scenario: dict) -> tuple[str, str]:
        """Run the first tool that needs no arguments (and is not a proposed action)."""
        candidates = [t for t in scenario["tools"]
                      if not t["requires_approval"] and not t["parameters"].get("required")]
        if not candidates:
            return SKIP, "no tool without required arguments"
        tool = candidates[0]
        result = self.post(f"/api/scenarios/{scenario['name']}/tools/{tool['name']}", {"arguments": {}})
        assert result.get("result") not in (None, "", [], {}), f"{tool['name']} returned nothing"
        return PASS, f"{tool['name']}: {result['full_chars']} characters in {result['duration_ms']:.0f} ms"

    def chat_turn(self, session_id: str, question: str) -> tuple[str, str]:
        answer = self.post(f"/api/sessions/{session_id}/turns",
                           {"message": question, "force_tool": True, "stream": False})
        events = list(answer["events"])
        rejected = 0
        while events and events[-1]["type"] == "approval_request" and rejected < 5:
            rejected += 1
            more = self.post(f"/api/approvals/{events[-1]['approval_id']}",
                             {"approved": False, "comment": "arbor verify never approves actions", "stream": False})
            events.extend(more["events"])
        tools = [e["name"] for e in events if e["type"] == "tool_result"]
        final = next((e for e in reversed(events) if e["type"] == "final"), None)
        assert tools, "no tool ran although the first step forced a tool call"
        assert final is not None, f"no final answer (last event: {events[-1]['type'] if events else 'none'})"
        assert final["content"].strip(), "the final answer is empty"
        note = f" ({rejected} proposal(s) rejected)" if rejected else ""
        return PASS, f"tools {', '.join(tools)}{note}; answer: {_short(final['content'])}"

    def cleanup(self) -> None:
        if self.keep:
            return
        for session_id in self._sessions:
            try:
                self.http.delete(f"/api/sessions/{session_id}")
            except httpx.HTTPError:
                pass

    def finish(self) -> int:
        print(render_table(self.rows))
        failed = sum(1 for r in self.rows if r.status == FAIL)
        print(f"\n{len(self.rows) - failed}/{len(self.rows)} checks without failure -> "
              f"{'OK' if not failed else 'FAILED'}")
        self.http.close()
        return 1 if failed else 0


def _expect(response: httpx.Response, status: int) -> None:
    if response.status_code != status:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text[:300]
        raise AssertionError(f"{response.request.method} {response.request.url.path} -> HTTP "
                             f"{response.status_code}: {message}")


def _short(value: Any, limit: int = 70) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def render_table(rows: list[CheckRow]) -> str:
    headers = ("check", "target", "result", "detail")
    data = [(r.check, r.target, r.status, r.detail) for r in rows]
    widths = [max(len(h), *(len(row[i]) for row in data)) if data else len(h) for i, h in enumerate(headers[:3])]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers[:3], widths, strict=True)) + "  " + headers[3]]
    lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 6)
    for row in data:
        lines.append("  ".join(v.ljust(w) for v, w in zip(row[:3], widths, strict=True)) + "  " + row[3])
    return "\n".join(lines)


def verify(base_url: str, chat: bool = False, timeout_s: float = 600.0, keep: bool = False,
           token: str | None = None) -> int:
    return Verifier(base_url, chat=chat, timeout_s=timeout_s, keep=keep, token=token).run()
