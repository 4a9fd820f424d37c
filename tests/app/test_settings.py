"""Settings validation."""

import pytest
from pydantic import ValidationError

from app.settings import WorkbenchSettings


def test_settings_defaults_and_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("ARBOR_DATA_DIR", str(tmp_path / "d"))
    monkeypatch.setenv("LLM_BASE_URL", "http://10.0.0.2:9000/v1/")
    monkeypatch.setenv("ARBOR_STEP_BUDGET", "9")
    settings = WorkbenchSettings(_env_file=None)
    assert settings.llm_base_url == "http://10.0.0.2:9000/v1"
    assert settings.database_url == f"sqlite:///{(tmp_path / 'd' / 'arbor.db').resolve()}"
    assert settings.checkpoint_path == tmp_path / "d" / "checkpoints.sqlite"
    assert settings.step_budget == 9 and settings.host == "127.0.0.1" and settings.port == 8090
    assert settings.incident_base_url == "http://127.0.0.1:8765"
    assert WorkbenchSettings(_env_file=None, tool_result_max_chars=9000,
                             tool_result_max_tokens=500).tool_result_budget_chars == 2000


@pytest.mark.parametrize("field,value", [("llm_base_url", "localhost:8080"), ("step_budget", 0),
                                         ("port", 70000), ("database_url", "mysql://x"),
                                         ("llm_timeout_s", -1), ("incident_base_url", "ftp://x")])
def test_settings_reject_bad_values(field, value):
    with pytest.raises(ValidationError):
        WorkbenchSettings(_env_file=None, **{field: value})
