"""Workbench operations over the database and the agent graph, used by the HTTP routes."""
