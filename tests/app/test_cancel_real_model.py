"""Cancelling a turn against arbor-server on the embedded model: the server sees its client
leave, finishes the request as `cancelled` and frees the slot; the branch then runs its next
turn from its last completed one."""

from __future__ import annotations

import json
import re
import time

import httpx
import pytest

from app.main import create_app
from app.settings import WorkbenchSettings
from tests.app.real_backends import real_backends
from tests.app.support import lab_catalog, live_server
from tests.workbench_auth import AUTH_HEADERS

pytestmark = [pytest.mark.model, pytest.mark.timeout(600)]


def _cancelled_requests(server: str) -> float:
    text = httpx.get(f"{server}/metrics", timeout=10).text
    match = re.search(r'^arbor:requests_total\{reason="cancelled"\} (\S+)$', text, re.M)
    return float(match.group(1)) if match else 0.0


def test_cancel_frees_the_server_slot_and_the_branch_goes_on(tmp_path):
    with real_backends(tmp_path, ["--parallel", "1", "--ctx-size", "4096"], incident=False) as urls:
        server = urls["llm"].removesuffix("/v1")
        settings = WorkbenchSettings(_env_file=None, llm_base_url=urls["llm"], llm_model="", data_dir=tmp_path / "var",
                                     llm_timeout_s=300, llm_max_tokens=2000, llm_temperature=0.0, step_budget=1)
        with live_server(create_app(settings, lab_catalog())) as url:
            api = httpx.Client(base_url=url, timeout=300, headers=AUTH_HEADERS)
            sid = api.post("/api/sessions", json={"scenario": "lab"}).json()["id"]
            with httpx.stream("POST", f"{url}/api/sessions/{sid}/turns", timeout=300, headers=AUTH_HEADERS,
                              json={"message": "Count from 1 to 2000, one number per line."}) as response:
                events, stopped = [], None
                for line in response.iter_lines():
                    if line.startswith("data:"):
                        events.append(json.loads(line[5:]))
                        if stopped is None and sum(e["type"] == "token" for e in events) == 3:
                            stopped = api.post(f"/api/turns/{events[0]['turn_id']}/cancel")
                assert events[-1]["type"] == "cancelled"
            assert stopped.status_code == 200 and stopped.json()["status"] == "cancelled"

            deadline = time.monotonic() + 60
            while _cancelled_requests(server) < 1 or any(
                    slot["is_processing"] for slot in httpx.get(f"{server}/slots", timeout=10).json()):
                assert time.monotonic() < deadline, "the server did not finish the request as cancelled"
                time.sleep(0.2)

            after = api.post(f"/api/sessions/{sid}/turns", json={"message": "Say hello.", "stream": False})
            assert after.status_code == 200, after.text
            assert after.json()["turn"]["status"] == "completed" and after.json()["turn"]["parent_turn_id"] is None
            assert _cancelled_requests(server) == 1
