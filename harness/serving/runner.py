"""Replay a manifest against an OpenAI-compatible server and measure every request.

Two modes:
- ``concurrency=N``: at most N requests in flight, started in manifest order;
- ``schedule=True``: each request starts at its line's ``t`` (seconds after the run starts).
In both, a request first waits for the request it depends on (``ordering.py``: the previous
turn of its session/branch), so a later turn never overtakes an earlier one.

Each line goes to the API it names (``ManifestLine.api``: chat completions, responses or
messages; a line without one is chat). Requests are always streamed (TTFT needs it), chat
ones with ``stream_options.include_usage``; the body is otherwise sent as recorded, less its
recorded ``cache`` hint: hints are the replay's own (`hint_states`, sent as headers unless
``session_hints`` is off). A Responses body is sent with ``store: false`` (a replay never
reads a stored response back; on arbor-server a stored response would also become its own
cache session, over the replay's hints). Errors are recorded per request and the run goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx

from harness.manifest import CHAT, ManifestLine
from harness.reports.results import RequestResult, RunResult
from harness.reports.summary import summarize
from harness.serving.endpoint import auth_headers, server_root
from harness.serving.ordering import predecessors
from harness.serving.server_probe import ServerTokenizer, ServerTokenizerUnavailable, first_model_id, server_info
from harness.serving.streamed_request import send_streaming
from harness.workloads.api_shapes import continues_with_tool_result, returned_tools, to_chat
from harness.workloads.generators import workload_ideal
from harness.workloads.ideal import IdealResult, ideal_computed

IDEAL_MODES = ("auto", "server", "words", "off")


@dataclass(frozen=True)
class ReplaySettings:
    """How to replay. ``concurrency`` is ignored when ``schedule`` is true."""

    base_url: str
    concurrency: int = 1
    schedule: bool = False
    api_key: str | None = None
    model: str | None = None
    timeout_s: float = 600.0
    force_output_length: bool = False
    session_hints: bool = True
    ideal: str = "auto"
    progress: bool = True
    label: str | None = None

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {self.concurrency}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s}")
        if self.ideal not in IDEAL_MODES:
            raise ValueError(f"ideal must be one of {', '.join(IDEAL_MODES)}, got {self.ideal!r}")
        server_root(self.base_url)  # validates the URL early


#: Messages requires max_tokens; a recorded body always has it, this is for hand-made ones.
MESSAGES_DEFAULT_MAX_TOKENS = 1024


def request_path(line: ManifestLine, body: dict) -> str:
    """Where a line's body goes: its API's path, except a chat line whose body is a completions
    prompt (bench.run_all --same-prompts renders every chat body into one), which goes to
    /v1/completions."""
    if line.api == CHAT and "prompt" in body and "messages" not in body:
        return "/v1/completions"
    return line.path


def prepare_body(line: ManifestLine, settings: ReplaySettings, default_model: str | None) -> dict[str, Any]:
    """The body actually sent: streaming (chat: with usage), a model name, an output length."""
    body = copy.deepcopy(line.body)
    # A recorded hint would win over the replay's headers (the body beats headers field by
    # field) and over --no-session-hints; the replay's hints come from hint_states instead.
    body.pop("cache", None)
    body["stream"] = True
    if line.api == CHAT:
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    if line.api == "responses":
        body["store"] = False
    if settings.model:
        body["model"] = settings.model
    elif not body.get("model") and default_model:
        body["model"] = default_model
    # the output length's field in each API
    limit = {"responses": ("max_output_tokens",), "messages": ("max_tokens",)}.get(
        line.api, ("max_tokens", "max_completion_tokens"))
    expected = line.expected_output_tokens
    if expected:
        if settings.force_output_length:
            # Same output length on every server: ask for exactly ``expected`` tokens.
            for name in limit[1:]:
                body.pop(name, None)
            body[limit[0]] = expected
            body["ignore_eos"] = True
        elif not any(name in body for name in limit):
            body[limit[0]] = expected
    if line.api == "messages" and "max_tokens" not in body:
        body["max_tokens"] = MESSAGES_DEFAULT_MAX_TOKENS
    return body


def hint_states(lines: Sequence[ManifestLine]) -> list[str]:
    """The lifecycle state each line's request announces, as the workbench lived it.

    A request's hint takes effect when it ends, so it says what its branch does next: the
    next line of the same session/branch continues with tool results -> ``tool_wait`` (tools
    or an approval in between); else another branch forks from it (its first line waits for this
    one, `ordering.py`) -> ``active``: others go on from its KV, the seed's collaboration wait
    (issue 58; before, such a fork point said ``done`` and was evicted first); else (a user
    message follows, or nothing) -> ``done`` (the turn ended).
    """
    states = ["done"] * len(lines)
    last_of: dict[str, int] = {}
    for waits_for, line in zip(predecessors(lines), lines):
        if waits_for is not None and lines[waits_for].cache_session != line.cache_session:
            states[waits_for] = "active"
    for index, line in enumerate(lines):
        key = line.cache_session
        if key in last_of and continues_with_tool_result(line.api, line.body):
            states[last_of[key]] = "tool_wait"
        last_of[key] = index
    return states


def hint_tools(lines: Sequence[ManifestLine]) -> list[str | None]:
    """The tool each line's `tool_wait` waits on: the tools whose results the next line of its session/branch
    brings back (`returned_tools`), so the server can learn how long each tool takes; None elsewhere."""
    tools: list[str | None] = [None] * len(lines)
    last_of: dict[str, int] = {}
    for index, line in enumerate(lines):
        key = line.cache_session
        if key in last_of:
            tools[last_of[key]] = returned_tools(line.api, line.body)
        last_of[key] = index
    return tools


def _hint_headers(line: ManifestLine, state: str, tool: str | None = None) -> dict[str, str]:
    # arbor-server's lifecycle hint; other servers ignore unknown headers
    headers = {"X-Arbor-Session": line.cache_session, "X-Arbor-Cache-State": state}
    if tool is not None and state == "tool_wait":
        headers["X-Arbor-Cache-Tool"] = tool
    return headers


async def _compute_ideal(lines: Sequence[ManifestLine], settings: ReplaySettings, client: httpx.AsyncClient,
                         root: str, headers: dict[str, str]) -> tuple[IdealResult | None, str | None]:
    """The workload's ideal, on the server's tokens when possible; (ideal, note)."""
    if settings.ideal == "off":
        return None, None
    if settings.ideal in ("auto", "server"):
        tokenizer = ServerTokenizer(client, root, headers)
        try:
            prompts = [await tokenizer.tokens(to_chat(line.api, line.body)) for line in lines]
            return ideal_computed(prompts, unit="tokens"), None
        except ServerTokenizerUnavailable as exc:
            if settings.ideal == "server":
                return None, f"server tokenization failed: {exc}"
            note = f"server tokenization unavailable ({exc}); ideal computed on words"
            return workload_ideal(lines), note
    return workload_ideal(lines), None


async def replay(lines: Sequence[ManifestLine], settings: ReplaySettings) -> RunResult:
    """Replay ``lines`` and return per-request results, summary and metadata."""
    root = server_root(settings.base_url)
    headers = auth_headers(settings.api_key)
    waits = predecessors(lines)
    states, tools = hint_states(lines), hint_tools(lines)
    limits = httpx.Limits(max_connections=None if settings.schedule else settings.concurrency,
                          max_keepalive_connections=None if settings.schedule else settings.concurrency)
    timeout = httpx.Timeout(settings.timeout_s, connect=min(30.0, settings.timeout_s))
    results: list[RequestResult | None] = [None] * len(lines)
    done = [asyncio.Event() for _ in lines]

    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        info = await server_info(client, root, headers)
        default_model = first_model_id(info)
        gate = contextlib.nullcontext() if settings.schedule else asyncio.Semaphore(settings.concurrency)
        bar = _progress(len(lines), settings.progress)
        run_start = time.perf_counter()

        async def one(index: int) -> None:
            line = lines[index]
            result = RequestResult(index=index, session_id=line.session_id, branch_id=line.branch_id,
                                   scheduled_t=line.t, api=line.api)
            try:
                wait = waits[index]
                if wait is not None:
                    await done[wait].wait()
                if line.after_s:  # its branch's tools run (recorded or generated), outside the gate
                    await asyncio.sleep(line.after_s)
                if settings.schedule:
                    delay = line.t - (time.perf_counter() - run_start)
                    if delay > 0:
                        await asyncio.sleep(delay)
                body = prepare_body(line, settings, default_model)
                request_headers = dict(headers)
                if settings.session_hints:
                    request_headers.update(_hint_headers(line, states[index], tools[index]))
                async with gate:
                    m = await send_streaming(client, root + request_path(line, body), body, request_headers,
                                             line.api)
                result.start_s = m.started - run_start
                result.latency_s = m.finished - m.started if m.finished is not None else None
                result.ttft_s = m.first_token - m.started if m.first_token is not None else None
                for name in ("prompt_tokens", "completion_tokens", "cached_tokens", "cached_tokens_from",
                             "cache_source", "finish_reason", "status", "error"):
                    setattr(result, name, getattr(m, name))
            except Exception as exc:  # noqa: BLE001 - one bad line must not stop the replay
                result.error = f"{type(exc).__name__}: {exc}"
            finally:
                results[index] = result
                done[index].set()
                bar.update(1)

        await asyncio.gather(*(one(i) for i in range(len(lines))))
        wall_s = time.perf_counter() - run_start
        bar.close()
        ideal, ideal_note = await _compute_ideal(lines, settings, client, root, headers)

    finished = [r for r in results if r is not None]
    metadata: dict[str, Any] = {
        "label": settings.label,
        "base_url": settings.base_url,
        "started_at": started_at,
        "mode": "schedule" if settings.schedule else "concurrency",
        "concurrency": None if settings.schedule else settings.concurrency,
        "force_output_length": settings.force_output_length,
        "requests": len(lines),
        "server": info,
    }
    if ideal_note:
        metadata["ideal_note"] = ideal_note
    summary = summarize(finished, wall_s, ideal)
    if ideal is not None and ideal.unit == "tokens":
        summary["ideal"]["prompt_token_mismatches"] = sum(
            1 for r, n in zip(finished, ideal.prompt_tokens) if r.prompt_tokens is not None and r.prompt_tokens != n)
    return RunResult(metadata=metadata, summary=summary, requests=finished)


class _NoProgress:
    """The progress bar's stand-in when none is shown: the benchmarks replay without one, so they run where tqdm is
    not installed (a GPU host: bench/device_suite.sh)."""

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(total: int, shown: bool):
    if not shown:
        return _NoProgress()
    from tqdm import tqdm  # only for a bar on the terminal

    return tqdm(total=total, unit="req", desc="replay")
