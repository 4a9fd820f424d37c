"""bench/mixed_ubatch.py on the embedded model, at a size that runs in seconds: both configurations
run, and the file it writes holds what it printed."""

from __future__ import annotations

import json

import pytest

from tests.server.conftest import embedded_model_available

pytestmark = pytest.mark.model


def test_a_small_run_writes_both_configurations(tmp_path):
    why = embedded_model_available()
    if why:
        pytest.skip(why)
    from bench import mixed_ubatch

    out = tmp_path / "mixed.json"
    mixed_ubatch.main(["--seqs", "2", "--context", "48", "--chunk", "8", "--steps", "2", "--repeats", "1",
                       "--out", str(out)])
    got = json.loads(out.read_text())
    assert set(got["ubatch_ms"]) == {"unpaged", "paged"}
    assert all(len(v) == 1 and v[0] > 0 for v in got["ubatch_ms"].values())
    assert got["paged_over_unpaged"] == pytest.approx(got["median_ms"]["paged"] / got["median_ms"]["unpaged"])
