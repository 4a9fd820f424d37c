"""ServerSettings: cache flags that only make sense together."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from server.cli import settings_from_args


def test_cache_dir_with_default_tiers_turns_the_disk_tier_on(tmp_path: Path):
    s = settings_from_args(["--cache-dir", str(tmp_path)])
    assert s.cache_tiers == ("A", "S", "H", "D") and s.tier_enabled("D")


def test_cache_dir_with_tiers_that_leave_out_d_is_refused(tmp_path: Path):
    with pytest.raises(ValidationError, match="leaves out D"):
        settings_from_args(["--cache-tiers", "A,S,H", "--cache-dir", str(tmp_path)])


def test_tier_d_without_a_directory_is_refused():
    with pytest.raises(ValidationError, match="needs --cache-dir"):
        settings_from_args(["--cache-tiers", "A,D"])


def test_the_idle_cell_limit_needs_a_tier_to_write_back_to():
    assert settings_from_args(["--cache-idle-cells", "512"]).cache_idle_cells == 512
    with pytest.raises(ValidationError, match="needs tier H or D"):
        settings_from_args(["--cache-tiers", "A,S", "--cache-idle-cells", "0"])
    with pytest.raises(ValidationError, match="needs tier H or D"):
        settings_from_args(["--no-cache", "--cache-idle-cells", "1024"])
