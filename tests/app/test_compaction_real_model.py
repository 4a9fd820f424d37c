"""Compaction that only moves forward, against arbor-server on the embedded model (issue 26).

A session far longer than a 2,048-token context: every turn is one model call (tools
forbidden) with a different page of notes. The workbench counts prompts with the server's own
template and tokenizer (/apply-template + /tokenize), so each compacted call's count equals
what the server reports (one more where the model's BOS is counted twice). Asserted on the
server's own `cached_tokens`:

- every call reuses everything before its newest turn (the previous call's prompt and answer)
  unless the branch's compaction level stepped forward in that very call;
- a fork from a compacted turn inherits the level there, and its first call reuses the
  parent's compacted prefix through that turn's answer.

Structure, not wording, is asserted. The per-call figures are printed (run with ``-s``).
"""

from __future__ import annotations

import pytest

from tests.app.support import make_settings, new_session, post_turn, workbench_client
from tests.server.conftest import start_server, stop_server

pytestmark = [pytest.mark.model, pytest.mark.timeout(1800)]

CTX = 2048
TURNS = 16
_WORDS = ("north", "south", "east", "west", "upper", "lower", "main", "spare", "old", "new", "cold", "hot")


def _notes(n: int) -> str:
    """About 1,000 characters, different for every turn (long enough that reducing shortens it)."""
    rows = [f"the {_WORDS[(n + i) % 12]} valve by the {_WORDS[(n * 5 + i) % 12]} pump was "
            f"{'open' if (n + i) % 3 else 'closed'} at dawn" for i in range(20)]
    return f"Note {n}: " + "; ".join(rows) + "."


def _calls(client, sid: str, turn_ids: list[str]) -> list[dict]:
    """Per turn (one model call each): the model span's attributes and its compaction span's."""
    spans = client.get(f"/api/sessions/{sid}/trace").json()["spans"]
    calls = []
    for turn_id in turn_ids:
        [model] = [s for s in spans if s["turn_id"] == turn_id and s["kind"] == "model"]
        compaction = [s["attributes"] for s in spans if s["turn_id"] == turn_id and s["kind"] == "compaction"]
        assert model["status"] == "ok", model["error"]
        calls.append({**model["attributes"], "compaction": compaction[0] if compaction else None})
    return calls


def _stepped(call: dict) -> bool:
    return bool(call["compaction"] and call["compaction"]["arbor.compaction.stepped"])


def _covered(previous: dict) -> int:
    """What a call after `previous` must find cached: its prompt and its answer (less the
    end-of-turn token a sampler may stop on without the template writing it)."""
    return previous["gen_ai.usage.input_tokens"] + previous["gen_ai.usage.output_tokens"] - 1


def _print(title: str, calls: list[dict]) -> None:
    print(f"\n{title}: context {CTX} tokens")
    for n, call in enumerate(calls, start=1):
        done = call["compaction"]
        level = (f"level reduced {done['arbor.compaction.level.reduced_messages']} / dropped "
                 f"{done['arbor.compaction.level.dropped_messages']} messages"
                 f"{', STEPPED' if done['arbor.compaction.stepped'] else ''}" if done else "not compacted")
        print(f"  call {n}: prompt {call['gen_ai.usage.input_tokens']}, cached "
              f"{call['gen_ai.usage.cache_read.input_tokens']}, output {call['gen_ai.usage.output_tokens']}; {level}")


def test_compaction_keeps_the_cached_prefix_between_steps_and_a_fork_reuses_it(tmp_path):
    server = start_server(tmp_path, "--parallel", "1", "--ctx-size", str(CTX))
    try:
        settings = make_settings(tmp_path, server.base_url + "/v1", llm_timeout_s=600, llm_max_tokens=24,
                                 llm_temperature=0.0, max_message_chars=2000)
        with workbench_client(settings) as client:
            sid = new_session(client)["id"]
            finals = [post_turn(client, sid, _notes(n) + "\nSummarise note " + str(n) + " in one line.",
                                tool_choice="none")[-1] for n in range(TURNS)]
            assert all(f["type"] == "final" for f in finals), finals
            ids = [f["turn_id"] for f in finals]
            calls = _calls(client, sid, ids)
            _print("main", calls)

            compacted = [i for i, c in enumerate(calls) if c["compaction"]]
            stepped = [i for i, c in enumerate(calls) if _stepped(c)]
            assert stepped, "the session never needed compaction: it does not test what it should"
            assert [i for i in compacted if i not in stepped], "no compacted call ran without stepping"
            for i in range(1, len(calls)):
                if i not in stepped:
                    cached = calls[i]["gen_ai.usage.cache_read.input_tokens"]
                    assert cached >= _covered(calls[i - 1]), (i, calls[i - 1], calls[i])
            for i in compacted:  # the level was chosen on the server's own count
                done = calls[i]["compaction"]
                assert done["arbor.compaction.exact"] is True
                assert done["arbor.compaction.tokens_after"] - calls[i]["gen_ai.usage.input_tokens"] in (0, 1)
            levels = [(c["compaction"] or {}).get("arbor.compaction.level.reduced_messages", 0) for c in calls]
            assert levels == sorted(levels), "a compaction level went back down"

            # fork after a compacted turn k whose next call did not step: the fork's first call
            # (a shorter message than turn k+1's) must not step either, and reuses through k's answer
            k = next(i for i in compacted if i + 1 < len(calls) and i + 1 not in stepped)
            fork = client.post(f"/api/sessions/{sid}/branches", json={"turn_id": ids[k]})
            assert fork.status_code == 201, fork.text
            forked = post_turn(client, sid, "Which valve was highest?", tool_choice="none")[-1]
            assert forked["type"] == "final", forked
            [first] = _calls(client, sid, [forked["turn_id"]])
            _print(f"fork from turn {k + 1}", [calls[k], first])
            assert first["compaction"] and not first["compaction"]["arbor.compaction.stepped"]
            assert first["gen_ai.usage.cache_read.input_tokens"] >= _covered(calls[k]), (calls[k], first)
    finally:
        stop_server(server)
