"""Workload generators: seeded, deterministic request manifests with known sharing.

Four shapes, each returning a :class:`GeneratedWorkload` (manifest lines + the workload's
ideal computed prompt tokens, see ``ideal.py``), in :data:`GENERATORS`:

- :func:`shared_prefix_groups` — groups x prompts per group, each group with its own system
  prompt and every prompt with its own question (like SGLang's generated-shared-prefix);
- :func:`agent_sessions` — multi-turn tool-using agent sessions in the style of the three
  scenarios: a shared system prompt and tool schemas, a per-session task, then a growing
  history of assistant tool calls and tool results;
- :func:`branch_fanout` — a trunk conversation and N branches that fork from its end;
- :func:`unique_prompts` — prompts that share nothing the generator controls.

A workload built from the workbench's own scenarios (app/replay/workloads.py: the story writer's
requests) uses the same building blocks: :func:`chat_body`, :func:`generated` and the checks
:func:`require_positive` and :func:`require_non_negative`.

Lengths are approximate, in words (about one token each for this text). The ideal is
computed on the server's tokens when a body tokenizer is given, else on word pieces of a
template-free rendering (``request_text.py``).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.manifest import ManifestLine
from harness.workloads.api_shapes import to_chat
from harness.workloads.ideal import IdealResult, ideal_computed, word_tokens
from harness.workloads.request_text import render_request_text
from harness.workloads.synthetic_text import SyntheticText

#: Turns a request body into the tokens of its prompt (ids from a server, or words).
BodyTokenizer = Callable[[dict], Sequence[Hashable]]

#: Generated bodies name no model unless asked: the runner fills in the server's first
#: model id (servers such as vLLM and arbor-server refuse names they do not serve).
DEFAULT_MODEL: str | None = None
#: Branch id of lines that belong to a plain, unbranched session.
MAIN_BRANCH = "main"


def words_of_body(body: dict) -> list[str]:
    """Default body tokenizer: word pieces of the template-free rendering."""
    return word_tokens(render_request_text(body))


def workload_ideal(lines: Sequence[ManifestLine], tokenize: BodyTokenizer | None = None) -> IdealResult:
    """Ideal computed prompt tokens of ``lines`` in manifest (arrival) order."""
    tokenizer = tokenize or words_of_body
    unit = "words" if tokenize is None else "tokens"
    return ideal_computed((tokenizer(to_chat(line.api, line.body)) for line in lines), unit=unit)


@dataclass
class GeneratedWorkload:
    """A generated manifest with its parameters and ideal."""

    kind: str
    params: dict[str, Any]
    lines: list[ManifestLine]
    ideal: IdealResult = field(default=None)  # type: ignore[assignment]

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "params": self.params, "requests": len(self.lines),
                "sessions": len({line.session_id for line in self.lines}), "ideal": self.ideal.to_dict()}


def chat_body(model: str | None, messages: list[dict], max_tokens: int, tools: list[dict] | None = None) -> dict:
    """A generated chat request: ``messages``, ``max_tokens``, greedy; ``model`` and ``tools`` when given."""
    body: dict[str, Any] = {"messages": messages, "max_tokens": max_tokens, "temperature": 0.0}
    if model:
        body["model"] = model
    if tools:
        body["tools"] = tools
    return body


def generated(kind: str, params: dict, lines: list[ManifestLine], tokenize: BodyTokenizer | None) -> GeneratedWorkload:
    """The workload of ``lines`` with its ideal (computed with ``tokenize``, see `workload_ideal`)."""
    return GeneratedWorkload(kind=kind, params=params, lines=lines, ideal=workload_ideal(lines, tokenize))


def require_positive(**values: int) -> None:
    """ValueError naming the first of ``values`` below 1."""
    for name, value in values.items():
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")


def require_non_negative(**values: float) -> None:
    """ValueError naming the first of ``values`` below 0."""
    for name, value in values.items():
        if value < 0:
            raise ValueError(f"{name} must not be negative, got {value}")


# -- shared-prefix groups ------------------------------------------------------------------

ORDERS = ("grouped", "interleaved", "shuffled")


def shared_prefix_groups(
    groups: int = 4,
    prompts_per_group: int = 8,
    system_len: int = 512,
    question_len: int = 64,
    output_len: int = 32,
    order: str = "interleaved",
    interval_s: float = 0.0,
    seed: int = 0,
    model: str | None = DEFAULT_MODEL,
    tokenize: BodyTokenizer | None = None,
) -> GeneratedWorkload:
    """Groups of single-turn prompts sharing a per-group system prompt.

    ``order``: ``grouped`` (all of group 0, then group 1, ...), ``interleaved`` (round robin
    over groups, which makes a single cached slot useless), or ``shuffled`` (seeded).
    Request ``i`` in the final order arrives at ``t = i * interval_s``.
    """
    require_positive(groups=groups, prompts_per_group=prompts_per_group, system_len=system_len,
                     question_len=question_len, output_len=output_len)
    require_non_negative(interval_s=interval_s)
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
    text = SyntheticText(seed)
    systems = [text.paragraph(system_len - 3, lead=f"Group {g} context:") for g in range(groups)]
    cells = [(g, p, text.paragraph(question_len - 3, lead=f"Question {g}.{p}:"))
             for g in range(groups) for p in range(prompts_per_group)]
    if order == "interleaved":
        cells.sort(key=lambda cell: (cell[1], cell[0]))
    elif order == "shuffled":
        text.rng.shuffle(cells)
    lines = [
        ManifestLine(
            t=round(i * interval_s, 6), session_id=f"group{g}-prompt{p}", branch_id=MAIN_BRANCH,
            body=chat_body(model, [{"role": "system", "content": systems[g]},
                                   {"role": "user", "content": question}], output_len),
            expected_output_tokens=output_len,
        )
        for i, (g, p, question) in enumerate(cells)
    ]
    params = dict(groups=groups, prompts_per_group=prompts_per_group, system_len=system_len,
                  question_len=question_len, output_len=output_len, order=order, interval_s=interval_s, seed=seed)
    return generated("shared-prefix", params, lines, tokenize)


# -- multi-turn agent sessions -------------------------------------------------------------

def _tool(name: str, description: str, **properties: str) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": {k: {"type": "string", "description": v}
                                                        for k, v in properties.items()},
                       "required": list(properties)}}}


#: Per scenario: the agent's role line and the tools it can call (synthetic stand-ins).
SCENARIOS: dict[str, tuple[str, list[dict]]] = {
    "financial_research": (
        "You are a financial research agent. Answer with figures from filings and prices, cite sources.",
        [_tool("get_filing", "Fetch a company filing section", company="ticker", section="section name"),
         _tool("get_price_history", "Daily closing prices", company="ticker", period="date range"),
         _tool("compute_ratio", "Compute a financial ratio", company="ticker", ratio="ratio name")],
    ),
    "field_maintenance": (
        "You are a field maintenance assistant. Diagnose equipment from manuals and sensor data.",
        [_tool("lookup_manual", "Search the equipment manual", equipment="model", query="topic"),
         _tool("get_sensor_readings", "Recent sensor readings", equipment="asset id", sensor="sensor"),
         _tool("create_work_order", "Open a work order", equipment="asset id", summary="what to do")],
    ),
    "edge_incident": (
        "You are an incident responder for an edge cluster. Find the cause, then mitigate safely.",
        [_tool("query_logs", "Search service logs", service="service", pattern="text to find"),
         _tool("get_service_status", "Health and metrics of a service", service="service"),
         _tool("restart_service", "Restart a service", service="service", reason="why")],
    ),
}


def agent_sessions(
    scenario: str = "edge_incident",
    sessions: int = 4,
    turns: int = 4,
    system_len: int = 400,
    user_len: int = 40,
    tool_result_len: int = 150,
    tool_call_len: int = 12,
    output_len: int = 48,
    session_interval_s: float = 0.0,
    think_time_s: float = 0.0,
    branches: int = 1,
    fork_after: int = 2,
    tool_wait_s: tuple[float, float] | None = None,
    seed: int = 0,
    model: str | None = DEFAULT_MODEL,
    tokenize: BodyTokenizer | None = None,
) -> GeneratedWorkload:
    """``sessions`` agent sessions of ``turns`` requests each, in arrival-time order.

    Every session sends the scenario's system prompt (``system_len`` words) and tools, then
    its own task; each later request appends the assistant's tool call (recorded, so the
    replay is deterministic) and the tool's result (``tool_result_len`` words). Session ``s``
    starts at ``s * session_interval_s``; turn ``k`` is due ``k * think_time_s`` later (the
    runner also waits for the session's previous turn). The last turn expects the answer
    (``output_len``); the others expect a tool call (``tool_call_len``).

    With ``branches`` > 1 each session forks after its first ``fork_after`` requests (branch
    ``main``, the trunk) into ``branches`` branches ``b0``, ``b1`` ...: each calls a tool of its own
    where the trunk stopped and goes on to ``turns`` requests, so a session sends
    ``fork_after + branches * (turns - fork_after)`` requests (issue 58's workload: 16 sessions, 4
    turns, 2 branches after 2: 96 requests). The runner starts a branch when the trunk is done.

    ``tool_wait_s`` = (lo, hi): each tool call takes time, so the request after it waits that long
    after its predecessor ends (``after_s``): each tool has a typical latency, log-uniform in [lo, hi],
    and each call varies around it (log-normal, sigma 0.5, clipped to [lo, hi]); drawn from a random
    stream of their own, so the texts are those of the same seed without waits.
    """
    if scenario not in SCENARIOS:
        raise ValueError(f"scenario must be one of {', '.join(SCENARIOS)}, got {scenario!r}")
    require_positive(sessions=sessions, turns=turns, system_len=system_len, user_len=user_len,
                     tool_result_len=tool_result_len, tool_call_len=tool_call_len, output_len=output_len)
    require_non_negative(session_interval_s=session_interval_s, think_time_s=think_time_s)
    branching = branches > 1
    if branching and not 1 <= fork_after < turns:
        raise ValueError(f"fork_after must be between 1 and turns - 1 ({turns - 1}), got {fork_after}")
    role_line, tools = SCENARIOS[scenario]
    text = SyntheticText(seed)
    latency = ToolLatency(tool_wait_s, seed) if tool_wait_s is not None else None
    system = text.paragraph(max(1, system_len - len(role_line.split())), lead=role_line)
    lines: list[ManifestLine] = []

    waits: dict[int, float | None] = {}  # id of a messages list -> how long its last tool took

    def tool_step(messages: list[dict], s: int, k: int, tag: str = "") -> None:
        """Append the assistant's (recorded) tool call and the tool's result."""
        tool = tools[text.rng.randrange(len(tools))]["function"]
        waits[id(messages)] = latency.draw(tool["name"]) if latency is not None else None
        arguments = {name: text.words(2) for name in tool["parameters"]["properties"]}
        call_id = f"call_{s}_{k}{tag}"
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": tool["name"], "arguments": json.dumps(arguments)}}]})
        messages.append({"role": "tool", "tool_call_id": call_id,
                         "content": text.paragraph(tool_result_len - 2, lead=f"Result {s}.{k}{tag}:")})

    def run_turns(messages: list[dict], s: int, ks: range, branch: str, start: float, tag: str = "") -> None:
        for k in ks:
            last = k == turns - 1
            expected = output_len if last else tool_call_len
            lines.append(ManifestLine(
                t=round(start + k * think_time_s, 6), session_id=f"{scenario}-{s}", branch_id=branch,
                body=chat_body(model, [dict(m) for m in messages], expected, tools), expected_output_tokens=expected,
                after_s=waits.pop(id(messages), None)))
            if last or (branching and k == ks.stop - 1 and branch == MAIN_BRANCH):
                break  # the end, or the fork: each branch makes its own call where the trunk stopped
            tool_step(messages, s, k, tag)

    for s in range(sessions):
        messages: list[dict] = [{"role": "system", "content": system},
                                {"role": "user", "content": text.paragraph(user_len - 2, lead=f"Task {s}:")}]
        start = s * session_interval_s
        run_turns(messages, s, range(fork_after if branching else turns), MAIN_BRANCH, start)
        for b in range(branches if branching else 0):
            branch = [dict(m) for m in messages]
            tool_step(branch, s, fork_after - 1, f"b{b}")
            run_turns(branch, s, range(fork_after, turns), f"b{b}", start, f"b{b}")
    lines.sort(key=lambda line: line.t)  # stable: a session's turns keep their order
    params = dict(scenario=scenario, sessions=sessions, turns=turns, system_len=system_len, user_len=user_len,
                  tool_result_len=tool_result_len, tool_call_len=tool_call_len, output_len=output_len,
                  session_interval_s=session_interval_s, think_time_s=think_time_s, seed=seed)
    if branching:
        params.update(branches=branches, fork_after=fork_after)
    if tool_wait_s is not None:
        params.update(tool_wait_s=list(tool_wait_s))
    return generated("agent-sessions", params, lines, tokenize)


class ToolLatency:
    """How long each tool call takes (agent_sessions' ``tool_wait_s``): a typical latency per tool,
    log-uniform in [lo, hi], each call log-normal around it (sigma 0.5), clipped to [lo, hi]."""

    SIGMA = 0.5

    def __init__(self, bounds: tuple[float, float], seed: int) -> None:
        lo, hi = bounds
        if not 0 < lo <= hi:
            raise ValueError(f"tool_wait_s must be 0 < lo <= hi, got {bounds}")
        self.lo, self.hi = lo, hi
        self.rng = random.Random(f"tool-latency-{seed}")
        self.typical: dict[str, float] = {}

    def draw(self, tool: str) -> float:
        if tool not in self.typical:
            self.typical[tool] = math.exp(self.rng.uniform(math.log(self.lo), math.log(self.hi)))
        value = self.typical[tool] * math.exp(self.rng.gauss(0.0, self.SIGMA))
        return round(min(self.hi, max(self.lo, value)), 3)


# -- branch fan-out ------------------------------------------------------------------------

TRUNK_BRANCH = "trunk"


def branch_fanout(
    branches: int = 4,
    trunk_len: int = 1024,
    branch_len: int = 64,
    branch_turns: int = 1,
    trunks: int = 1,
    reply_len: int = 32,
    output_len: int = 32,
    seed: int = 0,
    model: str | None = DEFAULT_MODEL,
    tokenize: BodyTokenizer | None = None,
) -> GeneratedWorkload:
    """``trunks`` conversations, each forking into ``branches`` branches at its end.

    Per trunk (one session): one trunk request (system prompt + a ``trunk_len``-word
    document + question, branch id ``trunk``), then each branch ``b{i}`` asks its own follow
    up (``branch_len`` words) after the trunk's recorded answer, for ``branch_turns`` turns.
    All lines have ``t = 0``: the runner starts a branch when the trunk request is done, so
    branches run side by side (they are what resident sharing and fan-out are for).
    """
    require_positive(branches=branches, trunk_len=trunk_len, branch_len=branch_len, branch_turns=branch_turns,
                     trunks=trunks, reply_len=reply_len, output_len=output_len)
    text = SyntheticText(seed)
    lines: list[ManifestLine] = []
    for r in range(trunks):
        session_id = f"fanout-{r}"
        trunk = [{"role": "system", "content": text.paragraph(30, lead=f"Assistant for case {r}.")},
                 {"role": "user", "content": text.paragraph(trunk_len, lead=f"Document {r}:")}]
        lines.append(ManifestLine(t=0.0, session_id=session_id, branch_id=TRUNK_BRANCH,
                                  body=chat_body(model, trunk, output_len), expected_output_tokens=output_len))
        trunk_reply = {"role": "assistant", "content": text.paragraph(reply_len - 2, lead="Summary:")}
        for b in range(branches):
            messages = [*trunk, trunk_reply]
            for k in range(branch_turns):
                messages.append({"role": "user", "content": text.paragraph(branch_len - 2, lead=f"Branch {b}.{k}:")})
                lines.append(ManifestLine(t=0.0, session_id=session_id, branch_id=f"b{b}",
                                          body=chat_body(model, [dict(m) for m in messages], output_len),
                                          expected_output_tokens=output_len))
                messages.append({"role": "assistant", "content": text.paragraph(reply_len)})
    params = dict(branches=branches, trunk_len=trunk_len, branch_len=branch_len, branch_turns=branch_turns,
                  trunks=trunks, reply_len=reply_len, output_len=output_len, seed=seed)
    return generated("branch-fanout", params, lines, tokenize)


# -- unique prompts ------------------------------------------------------------------------

def unique_prompts(
    count: int = 16,
    prompt_len: int = 256,
    output_len: int = 32,
    interval_s: float = 0.0,
    seed: int = 0,
    model: str | None = DEFAULT_MODEL,
    tokenize: BodyTokenizer | None = None,
) -> GeneratedWorkload:
    """``count`` single-message prompts, each starting with its own marker (no system prompt).

    Whatever the server's chat template adds in front (a default system prompt, role tags)
    is still shared; the ideal computed on the server's tokens accounts for it.
    """
    require_positive(count=count, prompt_len=prompt_len, output_len=output_len)
    require_non_negative(interval_s=interval_s)
    text = SyntheticText(seed)
    lines = [
        ManifestLine(t=round(i * interval_s, 6), session_id=f"unique-{i}", branch_id=MAIN_BRANCH,
                     body=chat_body(model, [{"role": "user",
                                             "content": text.paragraph(prompt_len - 1, lead=f"#{i}-{seed}")}],
                                    output_len),
                     expected_output_tokens=output_len)
        for i in range(count)
    ]
    params = dict(count=count, prompt_len=prompt_len, output_len=output_len, interval_s=interval_s, seed=seed)
    return generated("unique", params, lines, tokenize)


GENERATORS: dict[str, Callable[..., GeneratedWorkload]] = {
    "shared-prefix": shared_prefix_groups,
    "agent-sessions": agent_sessions,
    "branch-fanout": branch_fanout,
    "unique": unique_prompts,
}
