"""The agent: one LangGraph graph (model -> tools loop), its model adapter and tool handling."""
