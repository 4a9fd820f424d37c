"""bench/engine_inprocess.py on a tiny random-weight model through the real engine: every level's
rate, its samples and the engine thread's time per step split into forward and the rest."""

import json

from bench.engine_inprocess import main


def test_levels_report_rates_and_the_step_split(tmp_path, tiny_llama):
    out = tmp_path / "inproc.json"
    main(["--model", str(tiny_llama), "--threads", "1", "--parallel", "2", "--levels", "1,3", "--max-tokens", "6",
          "--repeat", "2", "--out", str(out)])
    data = json.loads(out.read_text())
    assert (data["parallel"], data["repeat"], data["max_tokens"]) == (2, 2, 6)
    assert [lv["concurrency"] for lv in data["levels"]] == [1, 3]  # 3 requests on 2 slots: one queues
    for lv in data["levels"]:
        assert len(lv["decode_tok_s_samples"]) == 2
        assert round(lv["decode_tok_s"], 1) in lv["decode_tok_s_samples"]
        assert lv["forward_us_per_step"] > 0 and lv["rest_us_per_step"] > 0
