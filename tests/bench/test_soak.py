"""The soak's short version: 60 seconds of mixed traffic at 2x the slots, with clients cutting
streams or abandoning whole answers, on all four cache tiers with small budgets. Nothing may
answer 5xx, the server must stay up, no tier may hold more than its budget (buffers and files
as they really are) at any sample, no slot may work once every client has gone, and at rest the
KV it holds must be what llama.cpp reports and within its budgets
(no cell held by nothing, also after a cache flush), and the disk tier's files must match its
index. (The long run: python -m bench.soak.)"""

from __future__ import annotations

import pytest

from bench.soak import over_budget, soak
from tests.server.conftest import embedded_model_available

pytestmark = pytest.mark.model


def test_sixty_second_soak(tmp_path):
    why = embedded_model_available()
    if why:
        pytest.skip(why)
    res = soak(duration_s=60, max_requests=10_000, parallel=2, log_dir=tmp_path, seed=1, cut_fraction=0.3)
    log = (tmp_path / "arbor-soak.log").read_text(errors="replace")[-3000:]
    assert res.server_alive, log
    assert res.requests > 0 and res.server_errors == 0 and res.client_errors == 0, (res, log)
    assert set(res.by_status) == {"200"}, res
    assert res.budget_violations == 0 and len(res.samples) > 10, [s for s in res.samples if over_budget(s)]
    assert res.answers_abandoned > 0 and res.busy_slots_after_clients_left == 0, res
    assert res.kv_end["idle"] and res.kv_end["slots_consistent"], res
    # the owners' budget charges the cells no slot or parked copy also holds (server/cache/resident.py)
    end = res.kv_end
    assert end["slot_cells"] <= 2 * 2048 and end["resident_charged_cells"] <= 512, res
    assert end["resident_cells"] <= 512 + end["slot_cells"] + end["parked_cells"], res
    assert res.disk_files == res.disk_index_files <= res.disk_index_entries, res
    # no leaked cells: llama.cpp's own count never exceeds what slots and resident owners hold,
    # and once the cache is flushed only the slots' kept prefixes hold any
    for kv in (res.kv_start, res.kv_end):
        assert kv["used_cells"] <= kv["slot_cells"] + kv["resident_cells"] + kv["parked_cells"], res
    assert res.kv_flushed["resident_cells"] == 0 and res.kv_flushed["used_cells"] <= res.kv_flushed["slot_cells"], res
