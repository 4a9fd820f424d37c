"""The LangGraph Platform API subset, served by the workbench (`/langgraph`), so `langgraph-sdk`,
agent-chat-ui and other LangGraph clients can drive Arbor's scenarios.

It is a view of the workbench's own records, never a second store:

    assistant  = a scenario (one each; its id a UUID derived from the name, or the name itself)
    thread     = a branch (its id the branch's id; a new thread is a new session's main branch)
    run        = a turn (its id the turn's id; a resume continues the same turn, so the same run)
    interrupt  = a pending approval (its id the approval's id), resumed with Command(resume=...)
    copy, or a run from an earlier checkpoint = a fork: a new branch, so a new thread

The wire format's shapes are `langgraph_sdk.schema`'s TypedDicts (wire.py builds them, mypy
checks them against those types, the tests validate the answers with them); messages are
langchain-core's own `model_dump()`. routes.py is the HTTP layer, threads.py and runs.py the
mapping, stream.py turns a turn's events into the run's stream modes.
"""
