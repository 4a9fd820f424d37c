"""The workloads ``arbor replay generate`` offers: the harness's four
(harness/workloads/generators.py) and one made of the workbench's own requests, the story writer's.

The story writer's workload lives here, not in the harness, because its bodies are what the
workbench sends: a scenario's system prompt and its tools' schemas as the agent renders them
(app/agent/scenario_tools.py); the harness imports none of the workbench.
"""

from __future__ import annotations

from collections.abc import Callable

from harness.manifest import ManifestLine
from harness.workloads import generators
from harness.workloads.generators import (
    DEFAULT_MODEL,
    MAIN_BRANCH,
    BodyTokenizer,
    GeneratedWorkload,
    chat_body,
    generated,
    require_non_negative,
    require_positive,
)
from scenarios.story_writer.generate_corpus import DEFAULT_CHARS as STORY_CORPUS_CHARS

STORY_TASKS = ("按照大纲写第三章《来客》。", "按照大纲写第四章《信号》。", "按照大纲写第五章《黎明》。",
               "祖父的日志里关于海燕号写了什么？", "林澈的左手有什么问题？", "苏晚的罗盘是从哪里来的？",
               "概括第二章，并列出其中的固定事实。", "雾港有哪些地方在雾天最危险？")


def story_writer_requests(
    requests: int = 8,
    corpus_chars: int = STORY_CORPUS_CHARS,
    output_len: int = 128,
    interval_s: float = 0.0,
    model: str | None = DEFAULT_MODEL,
    tokenize: BodyTokenizer | None = None,
) -> GeneratedWorkload:
    """``requests`` first requests of story-writer sessions, all due at once by default (seed 002:
    8 concurrent long prompts, 128 output tokens each).

    Each body is what the workbench sends for a new story_writer session: the scenario's system
    prompt with its corpus of ``corpus_chars`` characters (the scenario's default size unless
    asked) and its tool schemas, then one writing task (STORY_TASKS, in turn). Request ``i`` is
    due at ``i * interval_s``.
    """
    from app.agent.scenario_tools import openai_schema
    from scenarios.story_writer.scenario import build_scenario

    require_positive(requests=requests, output_len=output_len)
    require_non_negative(interval_s=interval_s, corpus_chars=corpus_chars)
    scenario = build_scenario(corpus_chars)
    tools = [openai_schema(tool) for tool in scenario.tools]
    lines = [
        ManifestLine(t=round(i * interval_s, 6), session_id=f"story_writer-{i}", branch_id=MAIN_BRANCH,
                     body=chat_body(model, [{"role": "system", "content": scenario.system_prompt},
                                            {"role": "user", "content": STORY_TASKS[i % len(STORY_TASKS)]}],
                                    output_len, tools),
                     expected_output_tokens=output_len)
        for i in range(requests)
    ]
    params = dict(requests=requests, corpus_chars=corpus_chars, output_len=output_len, interval_s=interval_s)
    return generated("story-writer", params, lines, tokenize)


#: every workload ``arbor replay generate KIND`` can write, by KIND
GENERATORS: dict[str, Callable[..., GeneratedWorkload]] = {
    **generators.GENERATORS,
    "story-writer": story_writer_requests,
}
