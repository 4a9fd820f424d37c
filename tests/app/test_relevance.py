"""Ranking a long list's items by the turn's question (app/agent/relevance.py): BM25 over the
question and the call's arguments, faults as a prior, ties by position, deterministic."""

from __future__ import annotations

from app.agent.relevance import FLAG_WEIGHT, RelevanceQuery, rank, tokens


def test_tokens_are_lowercased_lightly_stemmed_without_stop_words():
    assert tokens("Why are the Errors on pump-7 failing?") == ["error", "pump", "7", "fail"]
    assert tokens("device devices status class") == ["device", "device", "statu", "class"]


def test_cjk_runs_become_character_bigrams():
    assert tokens("海燕号的信号") == ["海燕", "燕号", "号的", "的信", "信号"]
    assert tokens("泵") == ["泵"]


def test_the_query_counts_argument_values_not_their_names():
    query = RelevanceQuery("What happened?", {"device_id": "pump-7", "hours": 6, "verbose": True})
    assert query.terms == ("6", "7", "happen", "pump")
    assert RelevanceQuery("  many\n  spaces  ").describe() == "many spaces"
    assert RelevanceQuery("x" * 300).describe(limit=10) == "x" * 9 + "…"


def test_matching_items_rank_first_and_keep_their_order():
    texts = [f"reading {i} of valve-{i} nominal" for i in range(20)]
    texts[4], texts[15] = "pump-7 pressure high", "pump-7 pressure nominal"
    ranking = rank(texts, RelevanceQuery("how is pump-7 doing?"))
    assert ranking.select(2) == [4, 15]
    assert ranking.reason(4) == "relevant" and ranking.reason(0) == "leading"


def test_faults_survive_when_the_question_is_unrelated():
    texts = [f"row {i} ok" for i in range(30)]
    texts[21] = "row 21 ERROR: sensor fault"
    ranking = rank(texts, RelevanceQuery("tell me a joke"))
    assert ranking.select(3) == [0, 1, 21], "the flagged row, then the first rows"
    assert ranking.reason(21) == "flagged"


def test_a_matching_fault_beats_a_matching_routine_item_and_a_match_beats_an_unrelated_fault():
    texts = ["pump-7 ok", "pump-3 alert: overheating", "pump-7 alert: overheating", "valve-2 ok"]
    ranking = rank(texts, RelevanceQuery("status of pump-7"))
    assert ranking.order[:3] == (2, 0, 1)
    assert 0 < FLAG_WEIGHT < 1


def test_words_every_item_shares_rank_nothing():
    texts = [f'{{"device":"d{i}","status":"ok"}}' for i in range(10)]
    ranking = rank(texts, RelevanceQuery("device status"))
    assert set(ranking.relevance) == {0.0} and ranking.select(3) == [0, 1, 2]


def test_no_query_and_empty_items_rank_by_position():
    assert rank(["", "", ""], RelevanceQuery("anything")).select(2) == [0, 1]
    assert rank(["a b", "c d"], None).select(1) == [0]
    assert rank([], RelevanceQuery("x")).select(3) == []


def test_ranking_is_deterministic():
    texts = [f"event {i % 7} on node-{i % 5} {'timeout' if i % 3 == 0 else 'ok'}" for i in range(200)]
    query = RelevanceQuery("timeouts on node-3", {"node": "node-3"})
    first = rank(texts, query)
    assert all(rank(list(texts), RelevanceQuery("timeouts on node-3", {"node": "node-3"})) == first
               for _ in range(3))
    assert first.select(10) == sorted(first.select(10))
