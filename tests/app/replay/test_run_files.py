"""Replay results files as the Replay page lists them (app/replay/run_files.py)."""

from app.replay.run_files import load_replay_runs


def test_replay_files_list_unreadable_files_with_the_reason(tmp_path):
    assert load_replay_runs(tmp_path).runs == []
    folder = tmp_path / "replay"
    folder.mkdir()
    (folder / "broken.json").write_text("{", encoding="utf-8")
    (folder / "other.json").write_text('{"format": "something-else"}', encoding="utf-8")
    found = load_replay_runs(tmp_path)
    assert found.runs == []
    reasons = {u["file"]: u["reason"] for u in found.unreadable}
    assert "cannot read replay results" in reasons["broken.json"]
    assert "not an arbor replay results file" in reasons["other.json"]
