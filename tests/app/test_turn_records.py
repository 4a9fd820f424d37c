"""The turn statuses and run options of app/db/models.py: stored as the same strings and JSON
objects as before they were typed, so rows written before read back and the pages (which read
the statuses as strings) see no change. The transitions themselves run in every turn test."""

from __future__ import annotations

from app.db.models import ACTIVE_TURN_STATES, ApprovalStatus, Run, RunOptions, TurnStatus


def test_statuses_are_the_stored_strings():
    assert [str(s) for s in TurnStatus] == ["running", "awaiting_approval", "completed", "failed", "cancelled"]
    assert [str(s) for s in ApprovalStatus] == ["pending", "approved", "rejected", "cancelled", "expired"]
    assert ACTIVE_TURN_STATES == ("running", "awaiting_approval")
    assert f"{TurnStatus.FAILED}" == "failed"  # as messages print them


def _run(options: dict | None) -> Run:
    return Run(session_id="s", branch_id="b", turn_id="t", thread_id="branch-b", options=options)


def test_run_options_read_old_rows_and_store_the_same_object():
    assert RunOptions.of(None) == RunOptions() == RunOptions.of(_run(None))
    old = {"force_tool": True, "tool_choice": {"type": "function", "function": {"name": "x"}}, "retry_of": "t0",
           "history_len": 4}
    options = RunOptions.of(_run(old))
    assert (options.force_tool, options.tool_choice, options.retry_of, options.history_len) == (
        True, old["tool_choice"], "t0", 4)
    assert options.stored() == old
    # a new run: force_tool and tool_choice always, retry_of and history_len once set
    assert RunOptions(tool_choice="required").stored() == {"force_tool": False, "tool_choice": "required"}
    assert RunOptions().model_copy(update={"history_len": 0}).stored() == {
        "force_tool": False, "tool_choice": None, "history_len": 0}
