"""`arbor replay generate` and `import-aiperf` (app/replay/cli.py), and the workbench's own workload
(app/replay/workloads.py: the story writer's requests) beside the harness's."""

import json

from app.replay import workloads
from app.replay.cli import main as replay_main
from harness.manifest import read_manifest
from harness.workloads import generators
from tests.harness.workloads.test_generators import brute_force_ideal, prompts_of


def test_generate_offers_the_harness_workloads_and_the_story_writer():
    assert list(workloads.GENERATORS) == [*generators.GENERATORS, "story-writer"]


def test_cli_generate_and_import(tmp_path, capsys):
    out = tmp_path / "g.jsonl"
    assert replay_main(["generate", "agent-sessions", "--out", str(out), "--sessions", "2", "--turns", "2",
                        "--scenario", "financial_research", "--system-len", "20"]) == 0
    lines = read_manifest(out)
    assert len(lines) == 4 and lines[0].session_id == "financial_research-0"
    assert '"ideal_computed_tokens"' in capsys.readouterr().out
    inputs = tmp_path / "inputs.json"
    inputs.write_text(json.dumps({"data": [{"session_id": "x", "payloads": [lines[0].body, lines[1].body]}]}))
    assert replay_main(["import-aiperf", str(inputs), "--out", str(tmp_path / "i.jsonl")]) == 0
    assert [ln.body for ln in read_manifest(tmp_path / "i.jsonl")] == [lines[0].body, lines[1].body]


def test_story_writer_requests_have_the_seeds_shape(tmp_path):
    """Seed 002: concurrent long prompts. Each body is a story_writer session's first request: the
    scenario's real system prompt (corpus at the asked size) and tools, then its own task."""
    from scenarios.story_writer.scenario import build_scenario

    workload = workloads.story_writer_requests(requests=8, corpus_chars=1500, output_len=128)
    scenario = build_scenario(1500)
    assert [line.t for line in workload.lines] == [0.0] * 8  # all due at once
    assert len({line.session_id for line in workload.lines}) == 8
    for line in workload.lines:
        system, user = line.body["messages"]
        assert system == {"role": "system", "content": scenario.system_prompt}
        assert line.body["tools"] == [t.openai_schema() for t in scenario.tools]
        assert user["role"] == "user" and line.expected_output_tokens == line.body["max_tokens"] == 128
    assert len({line.body["messages"][1]["content"] for line in workload.lines}) == 8
    prompts = prompts_of(workload)
    assert workload.ideal.ideal_computed_tokens == brute_force_ideal(prompts) < sum(map(len, prompts)) // 4

    out = tmp_path / "story.jsonl"
    assert replay_main(["generate", "story-writer", "--out", str(out), "--requests", "3",
                        "--corpus-chars", "800", "--interval-s", "0.5"]) == 0
    lines = read_manifest(out)
    assert [line.t for line in lines] == [0.0, 0.5, 1.0]
    assert lines[0].body["messages"][0]["content"] == build_scenario(800).system_prompt
