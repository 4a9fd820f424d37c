"""Persistence of sessions, turns, branches, runs, trace spans, artifacts and approvals (SQLModel)."""
