"""Chat prompts for measuring speculative decoding: agent turns that copy earlier context, and text that does not.

Each kind gives a distinct prompt per index (so concurrent streams do not share one answer), deterministic:

- `edit`: a Python file written back with one function renamed (an agent's file edit);
- `quote`: a tool's JSON result, of which the error entries are to be quoted verbatim (a tool result quoted back);
- `json_args`: a tool call whose JSON arguments carry a whole file from the conversation (arguments copying
  earlier context);
- `story`: a short story on a topic (free-running text an n-gram drafter has little to copy from).
"""

from __future__ import annotations

import json
import random

KINDS = ("edit", "quote", "json_args", "story")
AGENT_KINDS = ("edit", "quote", "json_args")

_TOPICS = ("a lighthouse keeper who finds a map", "a robot learning to paint", "two rival bakers in a small town",
           "a letter that arrives fifty years late", "a child who can talk to rivers", "the last train of the night",
           "a detective who is afraid of the dark", "a garden that grows at night", "a violin found in an attic",
           "a city where it always rains", "a dragon that collects clocks", "an astronaut's first day home",
           "a market that opens once a year", "a shipwreck and a stubborn cat", "a chess game across a war",
           "a mountain village and its bell")


def _python_file(i: int, n_functions: int = 12) -> str:
    """A file of small functions whose constants follow their index, shifted by `i` (the shape of issue 56's
    measurement: a 12-function file written back with one rename, about 400 tokens)."""
    return "\n".join(f"def func_{k}(x):\n    return x * {k + i} + {(k + i) ** 2}\n" for k in range(n_functions))


def _tool_result(i: int, n_entries: int = 14) -> str:
    rng = random.Random(1000 + i)
    services = ("api", "db", "cache", "queue", "auth")
    entries = []
    for k in range(n_entries):
        level = "ERROR" if k % 3 == 0 else "INFO"
        entries.append({"ts": f"2026-12-0{1 + k % 9}T10:{10 + k:02d}:00Z", "level": level,
                        "service": services[rng.randrange(len(services))],
                        "message": f"request {rng.randint(1000, 9999)} took {rng.randint(5, 900)} ms"})
    return json.dumps(entries, indent=1)


def messages(kind: str, i: int) -> list[dict]:
    """The chat messages of prompt `i` of `kind`."""
    if kind == "edit":
        code = _python_file(i)
        return [{"role": "user", "content": f"Rewrite this Python file, renaming func_{i % 12} to compute. "
                                             f"Output the whole file and nothing else.\n\n{code}"}]
    if kind == "quote":
        return [{"role": "system", "content": "You are an incident assistant. Quote tool results exactly."},
                {"role": "user", "content": "Which requests failed? Quote the ERROR entries exactly as the tool "
                                            f"returned them.\n\nTool result:\n{_tool_result(i)}"}]
    if kind == "json_args":
        code = _python_file(i, n_functions=6)
        return [{"role": "user", "content": "Save this file as src/steps.py. Answer only with the JSON arguments of "
                                            'write_file: {"path": "...", "content": "..."} with the whole file as '
                                            f"content.\n\n{code}"}]
    if kind == "story":
        return [{"role": "user", "content": f"Write a short story about {_TOPICS[i % len(_TOPICS)]}."}]
    raise ValueError(f"unknown kind {kind!r}: one of {', '.join(KINDS)}")
