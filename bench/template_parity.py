"""Does arbor-server render every chat template as stock llama-server does?

For each template the pinned llama.cpp ships (models/templates/*.jinja), one arbor-server and one
stock llama-server are started on the same model with that template (`--chat-template-file`),
and both render five conversations with `POST /apply-template`: a plain chat, the same with
tools, a tool call and its result, a multi-turn chat, and reasoning in the history. A render
agrees when both prompts are byte-identical, or both servers refuse it.

    LLAMA_SERVER=/path/to/llama-server python -m bench.template_parity [--only NAME ...]

Writes bench/results/template_parity.json and the table in docs/chat-families.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from harness.models.family_model import models_dir
from harness.serving.servers import arbor_command, find_llama_server, free_port, llama_server_command, running
from server.model_file import embedded_model_path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "template_parity.json"
DOC = ROOT / "docs" / "chat-families.md"
TABLE_START, TABLE_END = "<!-- parity-table -->", "<!-- /parity-table -->"

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
ASK = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Weather in Paris?"}]
CONVERSATIONS: dict[str, dict] = {
    "plain": {"messages": ASK},
    "tools": {"messages": ASK, "tools": [WEATHER]},
    "tool_result": {"messages": ASK + [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call0abc1", "type": "function", "function": {"name": "get_weather",
                                                                "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call0abc1", "content": '{"temp_c": 12}'}], "tools": [WEATHER]},
    "multi_turn": {"messages": ASK + [{"role": "assistant", "content": "It is 12 C."},
                                      {"role": "user", "content": "And tomorrow?"}]},
    "reasoning": {"messages": ASK + [{"role": "assistant", "content": "It is 12 C.",
                                      "reasoning_content": "The user asked about Paris."},
                                     {"role": "user", "content": "And tomorrow?"}]},
}


@dataclass
class Render:
    template: str
    conversation: str
    outcome: str  # same | differ | arbor_refuses | llama_refuses | both_refuse
    arbor: str | None
    llama: str | None


def _render(base_url: str | None, body: dict) -> str | None:
    if base_url is None:
        return None
    r = httpx.post(base_url + "/apply-template", json=body, timeout=60)
    return r.json().get("prompt") if r.status_code == 200 else None


def _outcome(a: str | None, b: str | None) -> str:
    if a is None and b is None:
        return "both_refuse"
    if a is None:
        return "arbor_refuses"
    if b is None:
        return "llama_refuses"
    return "same" if a == b else "differ"


def _started(name: str, command: list[str], port: int, log_dir: Path):
    """A running server, or None when it does not start (the template is refused at load)."""
    ctx = running(name, command, port, log_dir)
    try:
        return ctx, ctx.__enter__()
    except RuntimeError:
        return None, None


def compare(template: Path, llama_server: str, model: Path, log_dir: Path) -> list[Render]:
    pa, pl = free_port(), free_port()
    a_ctx, arbor = _started("arbor", arbor_command(pa, model, ["--chat-template-file", str(template),
                                                                  "--ctx-size", "2048", "--parallel", "1"]),
                            pa, log_dir)
    l_ctx, llama = _started("llama", llama_server_command(llama_server, pl, model, [
        "--jinja", "--chat-template-file", str(template), "-c", "2048", "-np", "1"]), pl, log_dir)
    try:
        out = []
        for name, body in CONVERSATIONS.items():
            a = _render(arbor.base_url if arbor else None, body)
            b = _render(llama.base_url if llama else None, body)
            out.append(Render(template.stem, name, _outcome(a, b), a, b))
        return out
    finally:
        for ctx in (a_ctx, l_ctx):
            if ctx is not None:
                ctx.__exit__(None, None, None)


def table(renders: list[Render]) -> str:
    by_template: dict[str, list[Render]] = {}
    for r in renders:
        by_template.setdefault(r.template, []).append(r)
    agree = sum(r.outcome in ("same", "both_refuse") for r in renders)
    whole = sum(all(r.outcome in ("same", "both_refuse") for r in rs) for rs in by_template.values())
    counts = {k: sum(r.outcome == k for r in renders) for k in ("same", "both_refuse", "differ", "arbor_refuses",
                                                                 "llama_refuses")}
    lines = [f"{whole} of {len(by_template)} templates agree on all {len(CONVERSATIONS)} conversations; "
             f"{agree} of {len(renders)} renders agree ({', '.join(f'{k} {v}' for k, v in counts.items())}).", "",
             "| template | " + " | ".join(CONVERSATIONS) + " |", "|---|" + "---|" * len(CONVERSATIONS)]
    for name, rs in sorted(by_template.items()):
        lines.append(f"| {name} | " + " | ".join(r.outcome for r in rs) + " |")
    return "\n".join(lines)


def write_doc(text: str) -> None:
    doc = DOC.read_text()
    head, rest = doc.split(TABLE_START, 1)
    _, tail = rest.split(TABLE_END, 1)
    DOC.write_text(f"{head}{TABLE_START}\n{text}\n{TABLE_END}{tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", help="template names (file stems) to compare")
    parser.add_argument("--llama-server", default=find_llama_server())
    parser.add_argument("--no-doc", action="store_true", help="do not rewrite the table in docs/chat-families.md")
    args = parser.parse_args(argv)
    if not args.llama_server:
        print("no stock llama-server: set LLAMA_SERVER or --llama-server (DEVELOPERS.md says how to build one)")
        return 2
    templates = sorted((models_dir() / "templates").glob("*.jinja"))
    if args.only:
        templates = [t for t in templates if t.stem in args.only]
    model = embedded_model_path()
    log_dir = ROOT / "bench" / "results" / "template_parity_logs"
    renders: list[Render] = []
    for i, template in enumerate(templates, 1):
        got = compare(template, args.llama_server, model, log_dir)
        print(f"[{i}/{len(templates)}] {template.stem}: {' '.join(r.outcome for r in got)}", flush=True)
        renders.extend(got)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps([asdict(r) for r in renders], indent=1, ensure_ascii=False))
    text = table(renders)
    print(text)
    if not args.no_doc and not args.only:
        write_doc(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
