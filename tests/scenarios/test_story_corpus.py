"""The story writer's generated corpus: deterministic, sized by one setting, consistent with the
shipped book; and what its default size costs on the embedded model (exact tokens, from the
real server's template and tokenizer)."""

from __future__ import annotations

import httpx
import pytest

from scenarios.story_writer import generate_corpus as gen
from scenarios.story_writer.scenario import LIBRARY, SCENARIO, build_scenario


def _fresh(chars: int, seed: int = 2):
    return gen.generate_corpus.__wrapped__(chars, seed)  # past the cache: really generated twice


def test_same_size_and_seed_give_the_same_corpus_byte_for_byte():
    assert _fresh(3000).render() == _fresh(3000).render()
    assert _fresh(3000).render() != _fresh(3000, seed=3).render()


@pytest.mark.parametrize("chars", [0, 1000, 2500, 9000])
def test_the_rendered_corpus_reaches_its_size_and_stops_there(chars):
    corpus = _fresh(chars)
    size = len(corpus.render())
    assert size >= chars
    if corpus.logbook:  # the logbook grew until the size was reached, not one entry further
        assert size - max(len(f"\n- {e.date}：{e.text}") for e in corpus.logbook) < chars
    else:
        assert chars == 0 and len(corpus.characters) == 3  # the core alone: main characters, places, facts
    days = [(e.year, e.month) for e in corpus.logbook]
    assert days == sorted(days) and all(gen.FIRST_YEAR <= year <= gen.LAST_YEAR for year, _ in days)
    assert len(_fresh(9000).characters) >= len(corpus.characters)  # townsfolk come with size


def test_the_corpus_agrees_with_the_shipped_book():
    corpus = _fresh(4000)
    names = {c.name for c in corpus.characters}
    assert {"林澈", "苏晚", "林守义"} <= names and len(names) == len(corpus.characters)
    continuity = LIBRARY.document("continuity.md")
    for fact in corpus.facts[:5]:  # continuity.md's facts, word for word
        assert fact.text in continuity
    haiyan = [e for e in corpus.timeline if "海燕号" in e.text and "三长一短" in e.text]
    assert [e.year for e in haiyan] == [1987]  # chapter 2: 一九八七年十月，“三长一短”
    assert not any("三长一短" in e.text for e in corpus.logbook)  # no other ship uses that signal


def test_dates_are_written_in_chinese_numerals():
    assert gen.chinese_number(1963) == "一九六三"
    assert [gen.chinese_count(n) for n in (1, 10, 12, 20, 26)] == ["一", "十", "十二", "二十", "二十六"]
    assert all(not any(ch.isdigit() for ch in e.date) for e in _fresh(5000).logbook)


def test_the_size_setting_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(gen.ENV_CHARS, raising=False)
    assert gen.corpus_chars_setting() == gen.DEFAULT_CHARS
    monkeypatch.setenv(gen.ENV_CHARS, " 12000 ")
    assert gen.corpus_chars_setting() == 12000
    for bad in ("many", "-5", "1.5"):
        monkeypatch.setenv(gen.ENV_CHARS, bad)
        with pytest.raises(ValueError, match=f"ARBOR_STORY_CORPUS_CHARS must be a whole number.*{bad!r}"):
            gen.corpus_chars_setting()


def test_the_scenario_prompt_carries_the_corpus_and_grows_with_it():
    small, large = build_scenario(0), build_scenario(6000)
    assert gen.generate_corpus(0).render() in small.system_prompt
    assert len(large.system_prompt) - len(small.system_prompt) >= 6000 - len(gen.generate_corpus(0).render())
    assert [t.name for t in small.tools] == [t.name for t in SCENARIO.tools]


def test_write_corpus_puts_each_section_in_a_file(tmp_path):
    paths = gen.write_corpus(_fresh(2000), tmp_path / "corpus")
    texts = [p.read_text(encoding="utf-8") for p in paths]
    assert [t.splitlines()[0] for t in texts] == ["## 人物档案", "## 地点", "## 年表", "## 固定事实",
                                                  "## 祖父日志（摘录）"]
    assert gen.main(["--chars", "2000", "--out", str(tmp_path / "cli")]) == 0
    assert sorted(p.name for p in (tmp_path / "cli").iterdir()) == [p.name for p in paths]


@pytest.mark.model
@pytest.mark.timeout(300)
def test_the_default_corpus_fills_most_of_the_embedded_models_context(tmp_path):
    """The default story writer's first request (system prompt + tool schemas + a question), as
    arbor-server renders and tokenizes it: more than half of the 8K context, with room left for
    LLM_MAX_TOKENS' default answer (512). Nothing is prefilled: /apply-template and /tokenize."""
    from tests.server.conftest import start_server, stop_server

    scenario = build_scenario(gen.DEFAULT_CHARS)
    server = start_server(tmp_path, "--ctx-size", "8192")
    try:
        messages = [{"role": "system", "content": scenario.system_prompt},
                    {"role": "user", "content": scenario.starter_questions[1]}]
        tools = [t.openai_schema() for t in scenario.tools]
        prompt = httpx.post(f"{server.base_url}/apply-template", json={"messages": messages, "tools": tools},
                            timeout=60).json()["prompt"]
        tokens = len(httpx.post(f"{server.base_url}/tokenize", json={"content": prompt}, timeout=60).json()["tokens"])
        n_ctx = httpx.get(f"{server.base_url}/props", timeout=10).json()["default_generation_settings"]["n_ctx"]
    finally:
        stop_server(server)
    print(f"story writer first request at the default corpus ({gen.DEFAULT_CHARS} chars): {tokens} tokens "
          f"of {n_ctx}")
    assert n_ctx == 8192 and n_ctx // 2 < tokens <= n_ctx - 512
