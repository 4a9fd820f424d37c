"""bench/restore_beside.py on a tiny random-weight model through the real engine: each mode restores the prompt from
host RAM beside a decoding request the way it names (staged, in pieces, whole), and the report renders its table."""

import json

from bench.report_cache import beside_table
from bench.restore_beside import main


def test_each_mode_restores_beside_the_decode_as_it_names(tmp_path, tiny_llama):
    out = tmp_path / "beside.json"
    main(["--model", str(tiny_llama), "--threads", "1", "--words", "300", "--decode", "600", "--repeats", "1",
          "--rounds", "2", "--out", str(out)])
    data = json.loads(out.read_text())
    runs = {(r["mode"], r["round"]): r for r in data["runs"]}
    assert set(runs) == {(m, k) for m in ("staged", "pieces", "whole") for k in (0, 1)}
    for r in runs.values():
        assert r["source"] == "H" and r["reused_tokens"] == r["prompt_tokens"] - 1 and r["fallbacks"] == 0, r
    for k in (0, 1):
        assert runs["staged", k]["staged_restores"] == 1 and runs["staged", k]["pieces"] == 0
        assert runs["pieces", k]["staged_restores"] == 0 and runs["pieces", k]["pieces"] >= 1
        assert runs["whole", k]["staged_restores"] == 0 and runs["whole", k]["pieces"] == 0
    table = beside_table(data)
    rows = [line.split(" |")[0] for line in table if line.startswith("| ") and not line.startswith("| mode")]
    assert rows == ["| staged", "| pieces", "| whole"]
