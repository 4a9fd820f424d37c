"""Hostile requests against a real arbor-server while another request decodes (issue 35).

    python -m bench.hostile_requests [--model M.gguf] [--stream-tokens 200] [--out FILE]

Starts arbor-server on the embedded model (or --model) with an API key and /v1/embeddings, then
runs two things at once, in two threads so neither's timing depends on the other's client work:

- a *watcher* that streams chat completions of --stream-tokens tokens (temperature 0,
  ignore_eos) back to back until every case was sent, and records the arrival time of every
  streamed chunk: the longest gap between two chunks of one stream is how long decoding (or
  its delivery) stalled. The issue's target is under a second; this script reports it and the
  cases in flight during each gap above --stall-s, and asserts nothing about time;
- a *sender* that sends each hostile case (bodies, headers, hosts, keys) one after the other
  and records its status, its latency, and whether the answer is a *clear error* (a 4xx with an
  OpenAI error body: message, type, param, code) or *served sanely* (a 2xx with the shape the
  route answers).

Then /health and /slots (every slot idle). Writes --out (default bench/results/hostile_requests.json)
and prints a summary; exits 1 when any case got a 5xx, an answer that is neither a clear error
nor a sane one, or /health failed after.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from harness.serving import sse
from harness.serving.servers import arbor_command, free_port, running

KEY = "bench-hostile-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
JSON = {"content-type": "application/json"}
MSG = [{"role": "user", "content": "hi"}]
CHAT, COMPL, NATIVE, EMB = "/v1/chat/completions", "/v1/completions", "/completion", "/v1/embeddings"
BIG = 10 * 2**20  # above the default --max-body-kib (4 MiB)


@dataclass
class Case:
    name: str
    method: str
    path: str
    make: Callable[[], dict]  # httpx request kwargs (built lazily: some bodies are megabytes)
    expect: str  # "error" (a 4xx with an OpenAI error body) or "served" (a 2xx)
    started: float = 0.0
    ended: float = 0.0
    result: dict = field(default_factory=dict)


def post(name: str, path: str, expect: str, make: Callable[[], dict]) -> Case:
    return Case(name, "POST", path, make, expect)


def body(expect: str, name: str, path: str, payload: Any, headers: dict | None = None) -> Case:
    """A JSON body sent with the key and the JSON content type."""
    return post(name, path, expect, lambda: {"json": payload, "headers": {**AUTH, **(headers or {})}})


def raw(expect: str, name: str, path: str, content: Any, headers: dict | None = None, auth: bool = True) -> Case:
    return post(name, path, expect, lambda: {"content": content() if callable(content) else content,
                                             "headers": {**(AUTH if auth else {}), **JSON, **(headers or {})}})


def chat(**fields) -> dict:
    return {"messages": MSG, "max_tokens": 4, **fields}


def schema(s) -> dict:
    return chat(response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": s}})


def tools(n: int, description: str = "d") -> list[dict]:
    parameters = {"type": "object", "properties": {"a": {"type": "string"}}}
    return [{"type": "function", "function": {"name": f"f{i}", "description": description, "parameters": parameters}}
            for i in range(n)]


def big_chat() -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": "x" * BIG}]}).encode()


def in_chunks(data: bytes):
    for i in range(0, len(data), 65536):
        yield data[i:i + 65536]


def words(n: int) -> str:
    base = "the pump station logs pressure flow and temperature every minute".split()
    return " ".join(base[i % len(base)] for i in range(n))


def cases() -> list[Case]:
    e, s = "error", "served"
    out = [
        # who may ask: Host, key, content type
        body(e, "Host of a rebound domain", CHAT, chat(), {"Host": "attacker.example"}),
        body(e, "Host of a rebound domain with the port", CHAT, chat(), {"Host": "attacker.example:8080"}),
        body(e, "Host localhost.attacker.example", CHAT, chat(), {"Host": "localhost.attacker.example"}),
        post("no API key", CHAT, e, lambda: {"json": chat()}),
        post("wrong API key", CHAT, e, lambda: {"json": chat(), "headers": {"Authorization": "Bearer nope"}}),
        post("non-ASCII API key", CHAT, e, lambda: {"json": chat(),
                                                    "headers": {"Authorization": "Bearer cl\u00e9".encode()}}),
        post("Basic instead of Bearer", CHAT, e,
             lambda: {"json": chat(), "headers": {"Authorization": "Basic " + KEY}}),
        post("a 12 KB API key", CHAT, e,
             lambda: {"json": chat(), "headers": {"Authorization": "Bearer " + "k" * 12000}}),
        post("no key, a 10 MB body", CHAT, e, lambda: {"content": big_chat(), "headers": JSON}),
        raw(e, "text/plain body", CHAT, json.dumps(chat()).encode(), {"content-type": "text/plain"}),
        raw(e, "form-encoded body", CHAT, b"messages=hi", {"content-type": "application/x-www-form-urlencoded"}),
        raw(e, "multipart body", CHAT, b"--x\r\n\r\nhi\r\n--x--", {"content-type": "multipart/form-data; boundary=x"}),
        post("body without Content-Type", CHAT, e, lambda: {"content": json.dumps(chat()).encode(), "headers": AUTH}),
        post("cache flush from a browser page", "/cache/flush", e,
             lambda: {"headers": {**AUTH, "Origin": "https://attacker.example"}}),
        raw(e, "cache hint as text/plain", "/cache/hint", b'{"session":"s","pin":true}',
            {"content-type": "text/plain"}),
        # sizes and shapes of the body
        raw(e, "10 MB body", CHAT, big_chat),
        raw(e, "10 MB body without length", CHAT, lambda: in_chunks(big_chat())),
        raw(e, "JSON nested 100 deep", CHAT, b'{"messages":[{"role":"user","content":"x"}],"x":' + b"[" * 100
            + b"]" * 100 + b"}"),
        raw(e, "JSON nested 100000 deep", CHAT, b'{"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
        raw(e, "lone surrogate", CHAT, b'{"messages":[{"role":"user","content":"a\\ud800b"}]}'),
        raw(e, "invalid UTF-8", CHAT, b'{"messages":[{"role":"user","content":"\xff\xfe"}]}'),
        raw(e, "not JSON", CHAT, b"{'messages': nope"),
        raw(e, "a JSON array", CHAT, b"[1, 2]"),
        raw(e, "a 5000-digit number", CHAT, b'{"messages":[{"role":"user","content":"x"}],"n_probs":' + b"9" * 5000
            + b"}"),
        raw(e, "temperature NaN", CHAT, b'{"messages":[{"role":"user","content":"x"}],"temperature":NaN}'),
        body(e, "2000 messages", CHAT, {"messages": MSG * 2000}),
        body(e, "prompt longer than the context", CHAT, chat(messages=[{"role": "user", "content": words(60_000)}])),
        body(e, "max_tokens 10**9", CHAT, chat(max_tokens=10**9)),
        # tools
        body(e, "1000 tools", CHAT, chat(tools=tools(1000))),
        body(e, "300 KB of tool definitions", CHAT, chat(tools=tools(100, "d" * 3000))),
        body(e, "tool_choice names a missing tool", CHAT, chat(tools=tools(1), tool_choice={
            "type": "function", "function": {"name": "nope"}})),
        body(s, "120 tools within the limits", CHAT, chat(tools=tools(120))),
        # stop strings
        body(e, "17 stop strings", CHAT, chat(stop=[str(i) for i in range(17)])),
        body(e, "a 100 kB stop string", CHAT, chat(stop=["x" * 100_000])),
        body(e, "a 257-character stop string, completions", COMPL, {"prompt": "x", "stop": "y" * 257}),
        body(s, "n=8 with 16 stop strings of 256 characters", CHAT, chat(
            n=8, max_tokens=64, temperature=1.0, stop=[chr(65 + i) * 255 + "q" for i in range(16)])),
        # n, sampling fields
        body(e, "n=1000", CHAT, chat(n=1000)),
        body(e, "n=9 (one above --max-choices)", CHAT, chat(n=9)),
        body(e, "top_logprobs 10**30", CHAT, chat(logprobs=True, top_logprobs=10**30)),
        body(e, "5000 logit_bias entries", CHAT, chat(logit_bias={str(i): 1 for i in range(5000)})),
        body(e, "5000 logit_bias pairs, /completion", NATIVE,
             {"prompt": "x", "logit_bias": [[i, 1] for i in range(5000)]}),
        body(e, "logit_bias token outside the vocabulary", CHAT, chat(logit_bias={"99999999": 1})),
        body(e, "logit_bias of 1e9", CHAT, chat(logit_bias={"1": 1e9})),
        body(s, "1024 logit_bias entries (the limit)", CHAT, chat(logit_bias={str(i): -1 for i in range(1024)})),
        # grammars and schemas
        body(e, "a 100000-character grammar", CHAT, chat(grammar='root ::= "' + "a" * 100_000 + '"')),
        body(e, "a grammar that does not parse", CHAT, chat(grammar="root ::= (((")),
        body(s, "a grammar with no way forward", CHAT, chat(grammar='root ::= "ab" [\\U00200000]', ignore_eos=True)),
        body(e, "a 100 KB response_format schema", CHAT, schema({"enum": ["x" * 100_000]})),
        body(e, "a 100 KB json_schema, completions", COMPL, {"prompt": "x", "json_schema": {"enum": ["x" * 100_000]}}),
        body(e, "schema maxItems 100000", CHAT, schema({"type": "array", "items": {"type": "integer"},
                                                       "maxItems": 100_000})),
        body(e, "schema remote $ref", CHAT, schema({"$ref": "https://example.com/s.json"})),
        body(e, "schema nested 60 deep", CHAT, schema(_nested_schema(60))),
        # embeddings
        body(e, "1000 embeddings inputs", EMB, {"input": ["x"] * 1000}),
        body(e, "embeddings token ids outside the vocabulary", EMB, {"input": [[99999999]]}),
        body(e, "an embeddings input longer than --embeddings-ctx", EMB, {"input": words(2000)}),
        body(s, "64 short embeddings inputs", EMB, {"input": [f"input {i}" for i in range(64)]}),
        body(s, "4 embeddings inputs of ~450 tokens", EMB, {"input": [words(420)] * 4}),
        # llama-server routes
        body(e, "detokenize ids outside the vocabulary", "/detokenize", {"tokens": [-1, 10**12]}),
        body(s, "tokenize 2 MB of text", "/tokenize", {"content": words(350_000)}),
        body(e, "apply-template with 1000 tools", "/apply-template", chat(tools=tools(1000))),
        body(e, "cache hint session of 300 characters", "/cache/hint", {"session": "s" * 300}),
        body(e, "/completion n_predict -5", NATIVE, {"prompt": "x", "n_predict": -5}),
        body(s, "template syntax inside a message", CHAT,
             chat(messages=[{"role": "user", "content": "{% for x in range(10**9) %}{{x}}{% endfor %}"}])),
        body(e, "POST to an unknown route", "/v1/nothing", chat()),
    ]
    return out


def _nested_schema(depth: int) -> dict:
    s: dict = {"type": "string"}
    for _ in range(depth):
        s = {"type": "object", "properties": {"a": s}, "required": ["a"]}
    return s


def classify(case: Case, r: httpx.Response) -> dict:
    """Status, whether the answer is a clear error or served sanely, and why not when neither."""
    out: dict[str, Any] = {"status": r.status_code, "expect": case.expect}
    try:
        doc = r.json()
    except ValueError:
        doc = None
    if 400 <= r.status_code < 500:
        err = doc.get("error") if isinstance(doc, dict) else None
        err = err if isinstance(err, dict) else {}
        clear = (set(err) == {"message", "type", "param", "code"}
                 and isinstance(err["message"], str) and 0 < len(err["message"].strip()) < 2000)
        out.update(kind="clear error" if clear else "unclear error", code=err.get("code") if clear else None,
                   message=(err["message"][:300] if clear else r.text[:300]))
    elif 200 <= r.status_code < 300:
        sane = isinstance(doc, dict) and any(k in doc for k in ("choices", "data", "tokens", "content", "prompt",
                                                                "flushed", "recorded", "session"))
        out.update(kind="served sanely" if sane else "served oddly", detail=None if sane else r.text[:300])
    else:
        out.update(kind="5xx" if r.status_code >= 500 else "other", detail=r.text[:300])
    out["ok"] = out["kind"] in ("clear error", "served sanely")
    out["as_expected"] = (out["kind"] == "clear error") == (case.expect == "error")
    return out


class Watcher(threading.Thread):
    """Streams chat completions back to back until told to stop; records chunk arrival times."""

    def __init__(self, url: str, tokens: int):
        super().__init__(daemon=True)
        self.url, self.tokens = url, tokens
        self.stop = threading.Event()
        self.streams: list[dict] = []
        self.error: str | None = None

    def run(self) -> None:
        body = {"messages": [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}],
                "max_tokens": self.tokens, "temperature": 0, "ignore_eos": True, "stream": True}
        with httpx.Client(timeout=600, headers=AUTH) as client:
            while not self.stop.is_set():
                t0 = time.perf_counter()
                times: list[float] = []
                try:
                    with client.stream("POST", self.url, json=body) as r:
                        r.raise_for_status()
                        for chunk in sse.json_chunks(r.iter_lines()):
                            if any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                                times.append(time.perf_counter())
                except httpx.HTTPError as exc:
                    self.error = f"{type(exc).__name__}: {exc}"
                    return
                gaps = [b - a for a, b in zip(times, times[1:])]
                self.streams.append({"t0": t0, "first": times[0] if times else None, "times": times,
                                     "chunks": len(times), "max_gap_s": max(gaps, default=0.0)})


def stalls(watcher: Watcher, sent: list[Case], threshold: float) -> list[dict]:
    """Every gap between two chunks of one stream longer than `threshold`, with the cases in flight."""
    out = []
    for i, st in enumerate(watcher.streams):
        for a, b in zip(st["times"], st["times"][1:]):
            if b - a > threshold:
                during = [c.name for c in sent if c.started < b and c.ended > a]
                out.append({"stream": i, "gap_s": round(b - a, 3), "cases_in_flight": during})
    return sorted(out, key=lambda x: -x["gap_s"])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=None, help="GGUF file (default: the embedded model)")
    p.add_argument("--stream-tokens", type=int, default=200, help="tokens of each watcher stream")
    p.add_argument("--stall-s", type=float, default=0.5, help="report every gap longer than this")
    p.add_argument("--only", default="", help="comma-separated substrings: run only the cases whose names match")
    p.add_argument("--server-args", default="", help="more arbor-server flags, e.g. '--batch-size 64'")
    p.add_argument("--out", type=Path, default=Path("bench/results/hostile_requests.json"))
    a = p.parse_args(argv)
    port = free_port()
    # mean pooling: the embedded model is generative (its GGUF says no pooling), so /v1/embeddings needs it
    cmd = arbor_command(port, a.model, ["--parallel", "4", "--ctx-size", "8192", "--api-key", KEY, "--embeddings",
                                        "--pooling", "mean", "--log-level", "warning", *a.server_args.split()])
    todo = [c for c in cases() if not a.only or any(w in c.name for w in a.only.split(","))]
    with running(f"arbor-hostile-{port}", cmd, port, a.out.parent / "logs") as srv:
        base = srv.base_url
        with httpx.Client(timeout=120) as warm:  # the watcher's prompt cached, the first stream not the slowest
            warm.post(srv.v1 + "/chat/completions", headers=AUTH, json={"messages": MSG, "max_tokens": 2})
        watcher = Watcher(srv.v1 + "/chat/completions", a.stream_tokens)
        watcher.start()
        while not watcher.streams and not watcher.error:  # one stream's worth of undisturbed baseline
            time.sleep(0.05)
        with httpx.Client(timeout=300) as client:
            for case in todo:
                kwargs = case.make()
                case.started = time.perf_counter()
                try:
                    r = client.request(case.method, base + case.path, **kwargs)
                    case.ended = time.perf_counter()
                    case.result = classify(case, r)
                except httpx.HTTPError as exc:
                    case.ended = time.perf_counter()
                    case.result = {"status": None, "kind": f"transport error: {type(exc).__name__}: {exc}",
                                   "ok": False, "as_expected": False, "expect": case.expect}
                case.result["latency_s"] = round(case.ended - case.started, 3)
                print(f"{case.result['status']!s:>4} {case.result['kind']:14s} {case.result['latency_s']:7.2f}s "
                      f"{case.name}", flush=True)
        # let the stream in flight finish, so the last cases are measured against decoding too
        n_streams = len(watcher.streams)
        deadline = time.monotonic() + 120
        while len(watcher.streams) == n_streams and not watcher.error and time.monotonic() < deadline:
            time.sleep(0.05)
        watcher.stop.set()
        watcher.join(timeout=300)
        health = httpx.get(base + "/health", timeout=30)
        slots = httpx.get(base + "/slots", headers=AUTH, timeout=30).json()
    five = [c.name for c in todo if (c.result.get("status") or 0) >= 500]
    not_ok = [c.name for c in todo if not c.result.get("ok")]
    unexpected = [c.name for c in todo if not c.result.get("as_expected")]
    baseline = watcher.streams[0]["max_gap_s"] if watcher.streams else None
    gaps = [st["max_gap_s"] for st in watcher.streams[1:]]
    out = {
        "command": " ".join(cmd), "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
        "cases": [{"name": c.name, "method": c.method, "path": c.path, **c.result} for c in todo],
        "n_cases": len(todo), "n_clear_errors": sum(c.result.get("kind") == "clear error" for c in todo),
        "n_served_sanely": sum(c.result.get("kind") == "served sanely" for c in todo),
        "five_xx": five, "neither_clear_nor_sane": not_ok, "unexpected_outcome": unexpected,
        "watcher": {"streams": len(watcher.streams), "tokens_per_stream": a.stream_tokens, "error": watcher.error,
                    "baseline_max_gap_s": baseline, "max_gap_s": max(gaps, default=None),
                    "per_stream_max_gap_s": [round(g, 3) for g in gaps],
                    "ttft_s": [round(st["first"] - st["t0"], 3) for st in watcher.streams if st["first"]]},
        "stalls_over_threshold": stalls(watcher, todo, a.stall_s),
        "health_after": health.status_code,
        "slots_after_idle": not any(s["is_processing"] for s in slots),
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=2))
    print(f"\n{len(todo)} cases: {out['n_clear_errors']} clear errors, {out['n_served_sanely']} served sanely, "
          f"{len(five)} 5xx, {len(not_ok)} neither, {len(unexpected)} not the expected outcome {unexpected or ''}")
    w = out["watcher"]
    print(f"watcher: {w['streams']} streams of {a.stream_tokens} tokens; longest gap between chunks "
          f"{w['max_gap_s']} s under attack (undisturbed first stream: {baseline} s)")
    for st in out["stalls_over_threshold"][:10]:
        print(f"  gap {st['gap_s']:.2f} s during: {', '.join(st['cases_in_flight']) or '(no case in flight)'}")
    print(f"/health after: {health.status_code}; slots idle: {out['slots_after_idle']}")
    print("wrote", a.out)
    if five or not_ok or health.status_code != 200 or watcher.error:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
