"""What rendering and reply parsing cost per request: llama.cpp's chat layer against the Python
path it replaced (Jinja2 renderer + Hermes stream parser, read from git at the commit before it).

One agent-shaped request (a long system prompt, six tools, an eight-step history with calls and
results) is rendered, and one reply (prose, then a tool call) is read as it streams, in pieces of
about one token (4 characters), so each path parses as the server does. Both paths run side by
side in one process, alternating, on the embedded model's template (SmolLM2: the Hermes fallback
on the new path) and, new path only, on Qwen3's (a thinking template the old path could not read).

    python -m bench.chat_layer_cost [--rounds 200] [--decode 5]

`--decode N` also starts arbor-server on the embedded model and times N alternating pairs of one
request with the agent's tools that the model answers in prose, decoding 128 tokens (ignore_eos,
greedy), with the tools on `auto` (the family's lazy grammar rides along every token, waiting for
its trigger) and on `none` (no grammar): what the lazy grammar costs a reply that calls nothing.
(A reply that calls a tool is constrained from the trigger on; that costs what a grammar costs.)

Writes bench/results/chat_layer_cost.json and prints a table.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gguf import GGUFReader

from harness.models.family_model import template_text
from server.api.engine_bridge.chat_layer import ChatTemplates
from server.api.engine_bridge.chat_request import ChatCompletionRequest
from server.api.engine_bridge.conversation import ChatOptions, plan_conversation
from server.api.engine_bridge.prompting import PreparedRequest
from server.model_file import embedded_model_path

ROOT = Path(__file__).resolve().parents[1]
OLD_COMMIT = "f01b977"  # the last commit with server/api/chat_template.py and tool_calls.py
RESULTS = ROOT / "bench" / "results" / "chat_layer_cost.json"


def _tool(i: int) -> dict:
    return {"type": "function", "function": {
        "name": f"tool_{i}", "description": f"Tool number {i}: looks something up in the local data set.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                       "required": ["query"]}}}


def agent_request() -> dict:
    tools = [_tool(i) for i in range(6)]
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a field maintenance assistant. " * 40},
                {"role": "user", "content": "Pump 7 reports low pressure. What should I check?"}]
    for step in range(4):
        call_id = f"call{step}abcd"
        messages += [
            {"role": "assistant", "content": f"Step {step}: checking.", "tool_calls": [
                {"id": call_id, "type": "function",
                 "function": {"name": f"tool_{step}", "arguments": json.dumps({"query": f"pump 7 part {step}"})}}]},
            {"role": "tool", "tool_call_id": call_id, "content": json.dumps({"rows": [step, step + 1], "ok": True})},
        ]
    return {"messages": messages, "tools": tools}


REPLY = ("The pressure sensor history shows a slow decline over three days, which points at the inlet "
         "filter rather than the impeller. " * 4
         + '\n<tool_call>\n{"name": "tool_4", "arguments": {"query": "pump 7 inlet filter", "limit": 5}}\n</tool_call>')


def _pieces(text: str, size: int = 4) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


def _old_modules():
    """The replaced Python path, loaded from git (its constant import rewritten)."""
    work = Path(tempfile.mkdtemp(prefix="arbor-old-chat-"))
    consts = 'TOOL_CALL_OPEN = "<tool_call>"\nTOOL_CALL_CLOSE = "</tool_call>"\n'
    mods = {}
    for name in ("chat_template", "tool_calls"):
        src = subprocess.run(["git", "show", f"{OLD_COMMIT}:server/api/{name}.py"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout
        src = src.replace("from server.api.grammars import TOOL_CALL_CLOSE, TOOL_CALL_OPEN\n", consts)
        path = work / f"old_{name}.py"
        path.write_text(src)
        spec = importlib.util.spec_from_file_location(f"old_{name}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up while defining
        spec.loader.exec_module(module)
        mods[name] = module
    return mods["chat_template"], mods["tool_calls"]


def _embedded_template() -> str:
    field = GGUFReader(str(embedded_model_path())).fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode()


def _ms(fn, rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def measure(rounds: int) -> dict:
    old_template_mod, old_calls_mod = _old_modules()
    body = ChatCompletionRequest(**agent_request())
    source = _embedded_template()
    old_template = old_template_mod.ChatTemplate(source, bos_token="", eos_token="<|im_end|>")
    new_templates = ChatTemplates(None, source)
    qwen3 = ChatTemplates(None, template_text("Qwen-Qwen3-0.6B"))
    names = {t["function"]["name"] for t in agent_request()["tools"]}
    pieces = _pieces(REPLY)

    def old_render():
        old_template.render(body.messages, body.tools)

    def old_parse():
        parser = old_calls_mod.ToolCallStreamParser(names)
        for p in pieces:
            parser.feed(p)
        parser.finish()
        assert parser.calls

    def new_parse_with(templates):
        conv = plan_conversation(templates, body, ChatOptions())

        def run():
            stream = PreparedRequest(None, conv, conv.prompt).reply_stream()  # type: ignore[arg-type]
            for p in pieces:
                stream.feed(p)
            stream.finish()
            assert stream.calls
        return run

    paths = {
        "render, old (Python Jinja2), SmolLM2": old_render,
        "render, new (llama.cpp), SmolLM2": lambda: plan_conversation(new_templates, body, ChatOptions()),
        "render, new (llama.cpp), Qwen3": lambda: plan_conversation(qwen3, body, ChatOptions()),
        "streamed parse, old (Hermes parser), SmolLM2": old_parse,
        "streamed parse, new (llama.cpp), SmolLM2": new_parse_with(new_templates),
        "streamed parse, new (llama.cpp), Qwen3": new_parse_with(qwen3),
    }
    samples: dict[str, list[float]] = {k: [] for k in paths}
    for _ in range(rounds):  # alternating, so both paths see the same machine
        for name, fn in paths.items():
            samples[name] += _ms(fn, 1)
    return {
        "rounds": rounds, "reply_chars": len(REPLY), "reply_pieces": len(pieces),
        "prompt_chars": len(plan_conversation(new_templates, body, ChatOptions()).prompt),
        "ms": {k: {"median": statistics.median(v), "p90": sorted(v)[int(len(v) * 0.9)]} for k, v in samples.items()},
    }


def measure_decode(pairs: int) -> dict:
    """Decode tok/s of one request with tools on auto (lazy grammar) and on none, alternating."""
    import httpx

    from harness.serving.servers import arbor_command, free_port, running
    port = free_port()
    prose = [{"role": "system", "content": "You are a storyteller."},
             {"role": "user", "content": "Tell me a long story about a lighthouse keeper and a storm."}]
    body = {"messages": prose, "tools": agent_request()["tools"], "max_tokens": 128, "temperature": 0,
            "ignore_eos": True}
    rates: dict[str, list[float]] = {"auto": [], "none": []}
    called = False
    with running("arbor", arbor_command(port, None, ["--parallel", "1"]), port,
                 ROOT / "bench" / "results" / "chat_layer_cost_logs") as server:
        for _ in range(pairs + 1):  # the first pair warms the cache and is dropped
            for choice in ("auto", "none"):
                answer = httpx.post(server.v1 + "/chat/completions", json={**body, "tool_choice": choice},
                                    timeout=600).json()
                called = called or bool(answer["choices"][0]["message"].get("tool_calls"))
                rates[choice].append(answer["timings"]["predicted_per_second"])
    return {**{k: statistics.median(v[1:]) for k, v in rates.items()}, "a_tool_was_called": called}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--decode", type=int, default=0, help="pairs of decode runs (0: skip)")
    args = parser.parse_args(argv)
    result = measure(args.rounds)
    if args.decode:
        result["decode_tok_s"] = measure_decode(args.decode)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1))
    print(f"prompt {result['prompt_chars']} chars; reply {result['reply_chars']} chars in "
          f"{result['reply_pieces']} pieces; {result['rounds']} rounds")
    print("| path | median ms | p90 ms |\n|---|---|---|")
    for name, m in result["ms"].items():
        print(f"| {name} | {m['median']:.2f} | {m['p90']:.2f} |")
    if "decode_tok_s" in result:
        d = result["decode_tok_s"]
        print(f"decode tok/s (median): tools auto (lazy grammar) {d['auto']:.1f}, tools none {d['none']:.1f}, "
              f"ratio {d['auto'] / d['none']:.3f}"
              f"{' (a tool was called: not a prose reply)' if d['a_tool_was_called'] else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
