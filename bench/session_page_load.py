"""How long the session page takes to show a long session, in Chromium.

    python -m bench.session_page_load [--turns 50] [--loads 5] [--out bench/results/session_page_load.json]

A session of the story writer (the longest prompt: every model request carries the system
prompt and the growing history, so the request bodies a trace holds grow quadratically) gets
`--turns` turns through the real workbench (uvicorn, a SQLite file) against the scripted
OpenAI fake of the tests: each turn one tool call (search_manuscript), its result and an
answer. Then Chromium (Debian's, through Playwright) opens the session page `--loads` times;
a load is the time from navigation to every turn drawn (`#conversation > li.turn` counted).
Also timed, by plain HTTP: what the page fetches (session detail, spans without bodies) and,
for comparison, what it fetched before issue 26 (the branch history with its checkpoint state,
spans with every request body), with their sizes. Nothing here is asserted: this measures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from app.main import create_app
from app.settings import WorkbenchSettings
from tests.fakes.scripted_openai import ScriptedOpenAI, ScriptedReply, tool_call
from tests.frontend.support import CHROMIUM, CHROMIUM_ARGS, serve
from tests.workbench_auth import AUTH_HEADERS, WORKBENCH_TOKEN, session_cookie

ANSWER = " ".join(["雾很大，灯按时亮了，海燕号的信号是三长一短。"] * 8)


def reply(body: dict) -> ScriptedReply:
    """A tool call after the user's message, an answer after the tool's result."""
    if body["messages"][-1]["role"] == "user":
        return ScriptedReply(tool_calls=[tool_call("search_manuscript", {"query": "海燕号"})])
    return ScriptedReply(content=ANSWER, cached_tokens=100, cache_source="A")


def timed_get(url: str) -> tuple[float, int]:
    start = time.perf_counter()
    response = httpx.get(url, timeout=60, headers=AUTH_HEADERS)
    response.raise_for_status()
    return (time.perf_counter() - start) * 1000, len(response.content)


def page_loads(url: str, turns: int, loads: int) -> list[float]:
    from playwright.sync_api import sync_playwright

    times = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.context.add_cookies([session_cookie()])
            for _ in range(loads):
                start = time.perf_counter()
                page.goto(url)
                page.locator("#conversation > li.turn").nth(turns - 1).wait_for(timeout=60_000)
                times.append((time.perf_counter() - start) * 1000)
        finally:
            browser.close()
    return times


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--turns", type=int, default=50)
    p.add_argument("--loads", type=int, default=5)
    p.add_argument("--out", type=Path, default=Path("bench/results/session_page_load.json"))
    a = p.parse_args(argv)
    fake = ScriptedOpenAI(reply).start()
    try:
        with tempfile.TemporaryDirectory() as data:
            settings = WorkbenchSettings(_env_file=None, llm_base_url=fake.base_url, llm_model="",
                                         data_dir=Path(data), step_budget=3, workbench_token=WORKBENCH_TOKEN)
            with serve(create_app(settings), "workbench") as url:
                sid = httpx.post(f"{url}/api/sessions", json={"scenario": "story_writer"},
                                 headers=AUTH_HEADERS).json()["id"]
                start = time.perf_counter()
                for i in range(a.turns):
                    answer = httpx.post(f"{url}/api/sessions/{sid}/turns", timeout=60, headers=AUTH_HEADERS,
                                        json={"message": f"第{i + 1}个问题：海燕号的信号是什么？", "stream": False})
                    answer.raise_for_status()
                filled_s = time.perf_counter() - start
                detail = httpx.get(f"{url}/api/sessions/{sid}", headers=AUTH_HEADERS).json()
                base = f"{url}/api/sessions/{sid}"
                fetches = {"session detail": f"{base}", "spans without bodies": f"{base}/trace?bodies=false",
                           "before: spans with bodies": f"{base}/trace",
                           "before: branch history": f"{base}/branches/{detail['active_branch_id']}"}
                http = {name: [timed_get(u) for _ in range(a.loads)] for name, u in fetches.items()}
                loads = page_loads(f"{url}/sessions/{sid}", a.turns, a.loads)
    finally:
        fake.stop()
    result = {
        "turns": a.turns, "model_requests": len(fake.requests), "fill_s": round(filled_s, 1),
        "page_load_ms": {"median": round(statistics.median(loads)), "max": round(max(loads)),
                         "all": [round(t) for t in loads]},
        "fetches": {name: {"median_ms": round(statistics.median(t for t, _ in runs), 1), "bytes": runs[0][1]}
                    for name, runs in http.items()},
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps(result, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
