"""The story writer's 20-prompt run (issue 59, item 5; seed 002 validated its story agent so).

    python -m bench.story_run [--prompts 20] [--out bench/results/story_run.json]
    python -m bench.story_run --workbench http://127.0.0.1:8090 --token TOKEN   # a running `make run`

Twenty story requests, one after another, in one story_writer session, through the workbench's
own streaming API (`POST /api/sessions/{id}/turns`, Server-Sent Events), as the session page
sends them: the chapter prompts name `append_chapter` (tool_choice), so each proposes a chapter
and waits for the operator, who approves it here (`POST /api/approvals/{id}`, streamed too); the
others force a first tool call (`force_tool`, what a 135M model needs to use its tools). Without
`--workbench` it starts what `make run` starts (arbor-server on the embedded model with the
cache tiers A,S,H,D, and `arbor serve`), on free ports, in a temporary directory.

Per request it records: TTFT (from the POST to the first streamed token, as the page sees it),
the time to the turn's end (approvals included, decided at once), model steps, prompt, output
and cached tokens (the server's counts, summed over the steps), the cache reuse (cached over
prompt tokens) and the cache source of each step, the tools that ran, approvals, retries of cut
tool calls, results fitted to the context, compactions, and how the turn ended. The results go to
`--out` (JSON: settings, per-request rows, summary); `report_section` is its part of
docs/benchmarks.md (`python -m bench.report`).

The model requests the workbench sent are written as a manifest (`--manifest`, default the
results' name with `.manifest.jsonl`; format harness/manifest.py, from
`GET /api/sessions/{id}/manifest`): `arbor replay MANIFEST --base-url URL` replays them against
any OpenAI-compatible server for comparison (llama-server, vLLM, SGLang), in order, each request
after the one its session depends on.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from harness.serving.servers import ROOT, free_port, wait_healthy
from harness.serving.sse import json_chunks

HEADING = "## The story writer's 20-prompt run"

CHAPTERS = ("第三章《来客》", "第四章《信号》", "第五章《黎明》", "第六章《回声》", "第七章《灯灭》")
QUESTIONS = (
    "祖父的日志里关于海燕号写了什么？", "林澈的左手有什么问题？", "苏晚的罗盘是从哪里来的？",
    "概括第二章，并列出其中的固定事实。", "雾港有哪些地方在雾天最危险？", "时间线上灯塔是哪一年停用的？",
    "风格指南对对话有什么要求？", "第一章里出现了哪些人物？", "连续性笔记里关于天气有哪些规定？",
    "在手稿里找出所有提到“铁门”的段落。", "大纲里第三幕的转折是什么？", "档案里关于旧码头的记录有哪些？",
    "哪些事实是后面章节不能改变的？", "检查这段草稿是否违背设定：苏晚在晴天独自出海。", "列出现有的章节和它们的长度。",
)
APPEND = {"type": "function", "function": {"name": "append_chapter"}}


def story_prompts(count: int = 20) -> list[dict]:
    """The run's requests (turn bodies), in order: a chapter's opening every fourth request (three
    sentences: a small model's whole chapter does not fit its context as one call's arguments),
    which names append_chapter; questions about the book, each with a forced first tool call,
    between them."""
    prompts: list[dict] = []
    chapters, questions = iter(CHAPTERS), iter(QUESTIONS)
    for i in range(count):
        chapter = next(chapters, None) if i % 4 == 0 else None
        if chapter is not None:
            prompts.append({"message": f"按照大纲写{chapter}的开头，只要三句话，写好后提交给我审阅。",
                            "tool_choice": APPEND})
        else:
            question = next(questions, None) or QUESTIONS[i % len(QUESTIONS)]
            prompts.append({"message": question, "force_tool": True})
    return prompts


@dataclass
class RequestRow:
    """One request of the run, as the workbench streamed it."""

    index: int
    message: str
    turn_id: str | None = None
    outcome: str = ""  # the final event's outcome, or "error" / "cancelled" / "refused"
    error: str | None = None
    ttft_s: float | None = None
    turn_s: float | None = None
    steps: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    first_prompt_tokens: int | None = None
    first_cached_tokens: int | None = None
    cache_sources: list[str | None] = field(default_factory=list)
    step_ttft_ms: list[float | None] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)
    approvals: int = 0
    retries: int = 0
    fitted_results: int = 0
    compactions: int = 0

    @property
    def reuse(self) -> float | None:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None


class Workbench:
    """The workbench's HTTP API, signed in with the operator token."""

    def __init__(self, base_url: str, token: str, timeout_s: float) -> None:
        self.base_url = base_url.rstrip("/")
        self.http = httpx.Client(base_url=self.base_url, headers={"Authorization": f"Bearer {token}"},
                                 timeout=httpx.Timeout(timeout_s, connect=10))

    def json(self, method: str, path: str, **kw: Any) -> Any:
        response = self.http.request(method, path, **kw)
        response.raise_for_status()
        return response.json() if response.content else None

    def events(self, path: str, body: dict) -> Iterator[tuple[float, dict]]:
        """The events a streamed turn (or a decision) sends, each with when it arrived."""
        with self.http.stream("POST", path, json=body) as response:
            if response.status_code != 200:
                response.read()
                raise RuntimeError(f"POST {path} -> {response.status_code}: {response.text[:300]}")
            for event in json_chunks(response.iter_lines()):
                yield time.perf_counter(), event


def run_request(wb: Workbench, session_id: str, index: int, body: dict) -> RequestRow:
    """Send one request, approve what it proposes, and read every event to the turn's end."""
    row = RequestRow(index=index, message=body["message"])
    start = time.perf_counter()
    path = f"/api/sessions/{session_id}/turns"
    payload: dict = dict(body)
    try:
        while True:
            terminal = None
            for at, event in wb.events(path, payload):
                terminal = _absorb(row, event, at - start) or terminal
            if terminal is None:
                raise RuntimeError("the stream ended without a final, error or approval event")
            if terminal["type"] != "approval_request":
                break
            row.approvals += 1
            path, payload = f"/api/approvals/{terminal['approval_id']}", {"approved": True, "comment": "story_run"}
    except (httpx.HTTPError, RuntimeError) as exc:
        row.outcome, row.error = row.outcome or "refused", str(exc)
    row.turn_s = time.perf_counter() - start
    return row


def _absorb(row: RequestRow, event: dict, at_s: float) -> dict | None:
    """Add one event to `row`; the event itself when it ends the stream."""
    kind = event.get("type")
    if kind == "turn":
        row.turn_id = row.turn_id or event["turn_id"]
    elif kind == "token" and row.ttft_s is None:
        row.ttft_s = at_s
    elif kind == "model_call":
        row.steps += 1
        row.prompt_tokens += event.get("prompt_tokens") or 0
        row.completion_tokens += event.get("completion_tokens") or 0
        row.cached_tokens += event.get("cached_tokens") or 0
        if row.first_prompt_tokens is None:
            row.first_prompt_tokens, row.first_cached_tokens = event.get("prompt_tokens"), event.get("cached_tokens")
        row.cache_sources.append(event.get("cache_source"))
        row.step_ttft_ms.append(event.get("ttft_ms"))
    elif kind == "tool_result" and not event.get("fitted"):
        row.tools.append(event["name"])
    elif kind == "tool_result":
        row.fitted_results += 1
    elif kind == "retry":
        row.retries += 1
    elif kind == "compacted":
        row.compactions += 1
    elif kind == "final":
        row.outcome = event.get("outcome") or "answered"
        return event
    elif kind in ("error", "cancelled"):
        row.outcome, row.error = kind, event.get("message")
        return event
    elif kind == "approval_request":
        return event
    return None


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarize(rows: list[RequestRow]) -> dict:
    ok = [r for r in rows if r.outcome not in ("error", "cancelled", "refused")]
    ttft = [r.ttft_s for r in rows if r.ttft_s is not None]
    turn = [r.turn_s for r in rows if r.turn_s is not None]
    prompt, cached = sum(r.prompt_tokens for r in rows), sum(r.cached_tokens for r in rows)
    later = rows[1:]
    return {
        "requests": len(rows), "completed": len(ok), "failed": len(rows) - len(ok),
        "outcomes": {o: sum(1 for r in rows if r.outcome == o) for o in sorted({r.outcome for r in rows})},
        "ttft_p50_s": _pct(ttft, 0.5), "ttft_p90_s": _pct(ttft, 0.9),
        "ttft_mean_s": statistics.fmean(ttft) if ttft else None,
        "turn_p50_s": _pct(turn, 0.5), "turn_p90_s": _pct(turn, 0.9), "turn_total_s": sum(turn),
        "steps": sum(r.steps for r in rows), "prompt_tokens": prompt, "cached_tokens": cached,
        "completion_tokens": sum(r.completion_tokens for r in rows),
        "reuse": cached / prompt if prompt else None,
        "first_step_reuse_after_first": (sum(r.first_cached_tokens or 0 for r in later)
                                         / sum(r.first_prompt_tokens or 0 for r in later)
                                         if sum(r.first_prompt_tokens or 0 for r in later) else None),
        "approvals": sum(r.approvals for r in rows), "tools": sum(len(r.tools) for r in rows),
        "retries": sum(r.retries for r in rows), "fitted_results": sum(r.fitted_results for r in rows),
        "compactions": sum(r.compactions for r in rows),
    }


def run(wb: Workbench, prompts: list[dict], manifest: Path | None, log=print,
        progress: Callable[[dict], object] | None = None) -> dict:
    """The run: its session, rows and summary; `progress` gets the same after each request (and
    the manifest is written then too), so a run stopped half way leaves what it measured."""
    session = wb.json("POST", "/api/sessions", json={"scenario": "story_writer", "title": "bench.story_run"})
    rows: list[RequestRow] = []
    result: dict = {}
    for i, body in enumerate(prompts):
        row = run_request(wb, session["id"], i, body)
        rows.append(row)
        log(f"[{i + 1}/{len(prompts)}] {row.outcome:<14} ttft {_s(row.ttft_s)} turn {_s(row.turn_s)} "
            f"steps {row.steps} prompt {row.prompt_tokens} cached {row.cached_tokens} approvals {row.approvals} "
            f"tools {','.join(row.tools) or '-'}{' error: ' + str(row.error)[:120] if row.error else ''}")
        if manifest is not None:
            response = wb.http.get(f"/api/sessions/{session['id']}/manifest")
            response.raise_for_status()
            manifest.parent.mkdir(parents=True, exist_ok=True)
            manifest.write_text(response.text)
        result = {"session_id": session["id"], "complete": len(rows) == len(prompts),
                  "rows": [{**asdict(r), "reuse": r.reuse} for r in rows], "summary": summarize(rows)}
        if progress is not None:
            progress(result)
    return result


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


@contextmanager
def own_stack(work: Path, server_args: list[str], llm_timeout_s: float,
              max_tokens: int | None = None) -> Iterator[tuple[str, str, list[str]]]:
    """arbor-server on the embedded model and `arbor serve`, as `make run` starts them (no
    incident service: the story writer does not use it; LLM_TIMEOUT_S `llm_timeout_s`, for a loaded
    machine; LLM_MAX_TOKENS `max_tokens` when given); yields (workbench URL, token, server command)."""
    token = secrets.token_urlsafe(24)
    server_port, workbench_port = free_port(), free_port()
    server_cmd = [sys.executable, "-m", "server", "--port", str(server_port), "--cache-dir", str(work / "kv-cache"),
                  "--cache-tiers", "A,S,H,D", *server_args]
    env = {**os.environ, "LLM_BASE_URL": f"http://127.0.0.1:{server_port}/v1", "ARBOR_DATA_DIR": str(work / "var"),
           "ARBOR_WORKBENCH_TOKEN": token, "ARBOR_PORT": str(workbench_port), "LLM_TIMEOUT_S": str(llm_timeout_s)}
    env.pop("DATABASE_URL", None)
    if max_tokens:
        env["LLM_MAX_TOKENS"] = str(max_tokens)
    with ExitStack() as stack:
        for name, cmd, url, path in (
                ("server", server_cmd, f"http://127.0.0.1:{server_port}", "/health"),
                ("workbench", [sys.executable, "-m", "app", "serve", "--port", str(workbench_port)],
                 f"http://127.0.0.1:{workbench_port}", "/healthz")):
            log = stack.enter_context((work / f"{name}.log").open("w"))
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
            stack.callback(_stop, proc)
            wait_healthy(proc, url, 300, name, partial(_tail, work / f"{name}.log"), path=path)
        yield f"http://127.0.0.1:{workbench_port}", token, server_cmd


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def report_section(res: Path) -> list[str]:
    """The run's part of docs/benchmarks.md, from bench/results/story_run.json."""
    path = res / "story_run.json"
    out = [HEADING, "",
           "Command: `python -m bench.story_run` (20 requests in one story_writer session through the workbench's "
           "streaming API, on the embedded model with `make run`'s server settings; chapter requests name "
           "append_chapter and are approved, the others force a first tool call). Its manifest replays anywhere: "
           "`arbor replay bench/results/story_run.manifest.jsonl --base-url URL`.", ""]
    if not path.exists():
        return out + ["Not measured in this revision (bench/results/story_run.json is missing).", ""]
    data = json.loads(path.read_text())
    s = data["summary"]
    settings = data.get("settings", {})
    if settings.get("llm_max_tokens"):
        out += [f"LLM_MAX_TOKENS {settings['llm_max_tokens']} (make run's is 512).", ""]
    if not data.get("complete", True):
        out += [f"The run stopped after {s['requests']} of its requests; the figures are theirs.", ""]
    out += [f"{s['completed']} of {s['requests']} requests ended with an answer ({_outcomes(s['outcomes'])}); "
            f"{s['approvals']} approvals, {s['tools']} tool runs, {s['steps']} model steps, {s['retries']} retried "
            f"cut tool calls, {s['fitted_results']} results fitted to the context, {s['compactions']} compactions. "
            f"TTFT p50 {_f(s['ttft_p50_s'])} s, p90 {_f(s['ttft_p90_s'])} s; a request's whole turn p50 "
            f"{_f(s['turn_p50_s'])} s, p90 {_f(s['turn_p90_s'])} s ({_f(s['turn_total_s'], 0)} s in all). "
            f"Cache reuse {_pct_text(s['reuse'])} of {s['prompt_tokens']:,} prompt tokens "
            f"({_pct_text(s['first_step_reuse_after_first'])} of each later request's first step).", "",
            "TTFT is the page's: from the POST to the first streamed token of the answer, which comes after the "
            "forced tool step (and the approval, decided at once); step 1 is the model's own time to its first "
            "token in the first step.", "",
            "| # | request | outcome | TTFT s | step 1 TTFT s | turn s | steps | prompt tok | cached tok | reuse | "
            "sources | approvals | tools |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        sources = "/".join(src or "-" for src in r["cache_sources"]) or "-"
        first = r["step_ttft_ms"][0] / 1000 if r["step_ttft_ms"] and r["step_ttft_ms"][0] is not None else None
        out.append(f"| {r['index'] + 1} | {r['message'][:18]} | {r['outcome']} | {_f(r['ttft_s'])} | {_f(first)} | "
                   f"{_f(r['turn_s'], 1)} | {r['steps']} | {r['prompt_tokens']:,} | {r['cached_tokens']:,} | "
                   f"{_pct_text(r['reuse'])} | {sources} | {r['approvals']} | {len(r['tools'])} |")
    return out + [""]


def _outcomes(outcomes: dict) -> str:
    return ", ".join(f"{n} {name}" for name, n in outcomes.items())


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct_text(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=20)
    p.add_argument("--workbench", help="a running workbench (default: start arbor-server and arbor serve here)")
    p.add_argument("--token", default=os.environ.get("ARBOR_WORKBENCH_TOKEN"), help="its operator token")
    p.add_argument("--server-arg", action="append", default=[], help="an extra arbor-server argument (own stack)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds one streamed request may take")
    p.add_argument("--llm-timeout", type=float, default=600.0, help="the own workbench's LLM_TIMEOUT_S")
    p.add_argument("--max-tokens", type=int, help="the own workbench's LLM_MAX_TOKENS (default: its own, 512)")
    p.add_argument("--out", type=Path, default=Path("bench/results/story_run.json"))
    p.add_argument("--manifest", type=Path, help="default: --out with .manifest.jsonl")
    a = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the servers it started on the way out
    manifest = a.manifest or a.out.with_name(a.out.stem + ".manifest.jsonl")
    prompts = story_prompts(a.prompts)
    settings: dict[str, Any] = {"prompts": a.prompts}
    started = time.time()
    with ExitStack() as stack:
        if a.workbench:
            if not a.token:
                p.error("--workbench needs --token (or ARBOR_WORKBENCH_TOKEN)")
            url, token = a.workbench, a.token
            settings["workbench"] = url
        else:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="story_run-")))
            url, token, server_cmd = stack.enter_context(own_stack(work, a.server_arg, a.llm_timeout, a.max_tokens))
            settings["llm_timeout_s"] = a.llm_timeout
            if a.max_tokens:
                settings["llm_max_tokens"] = a.max_tokens
            settings["server_command"] = " ".join(Path(c).name if i == 0 else c for i, c in enumerate(server_cmd))
        wb = Workbench(url, token, a.timeout)

        def save(partial: dict) -> dict:
            whole = {"benchmark": "story_run", "settings": settings, "started": started, "manifest": str(manifest),
                     **partial}
            a.out.parent.mkdir(parents=True, exist_ok=True)
            a.out.write_text(json.dumps(whole, indent=2, ensure_ascii=False))
            return whole

        result = save(run(wb, prompts, manifest, log=lambda line: print(line, flush=True), progress=save))
    print(json.dumps(result["summary"], indent=2))
    print("wrote", a.out, "and", manifest)
    return 0 if result["summary"]["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
