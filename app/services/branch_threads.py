"""One LangGraph thread per branch: where its turns start, how a fork copies state into a
new thread, which checkpoints a user can fork from.

A branch's thread (`branch_thread_id`) holds its conversation. Each turn runs the graph
from an explicit checkpoint of that thread (a config with `checkpoint_id`): the end of the
branch's last completed turn, or the branch's base. A failed turn's half-advanced
checkpoints therefore stay in the thread's history but are never continued: the next turn
(a retry, or any new message) starts from the last good checkpoint again, as LangGraph's
time travel does.

A fork copies the chosen checkpoint's values into the new branch's thread with
`aupdate_state`, `as_node` chosen so that the copy has the same next node as the original
(nothing pending for a turn's end; the tools, say, for a checkpoint before a tool result).
The values are copied, not referenced: a branch's thread never depends on another's.

Messages in the state are langchain-core messages (app/agent/messages.py converts at the
boundary, keeping tool-call arguments byte for byte); a thread is seeded from the OpenAI dicts
the turn tree records, and `openai_messages` gives them back as dicts wherever they are stored
or shown (dicts, from threads written before, are kept as they are).
"""

from __future__ import annotations

from typing import Any

from langgraph.constants import END, START
from langgraph.types import StateSnapshot

from app.agent.graph import build_graph
from app.agent.messages import from_openai, to_openai


def writers_of(compiled: Any) -> dict[tuple[str, ...], str]:
    """For each node a checkpoint can wait on (its `next`; () for the end), the node that, given
    as `as_node`, leaves a copied state with that same next node: the source of a plain edge to
    it (approval -> tools, tools -> model, budget_exhausted -> END), else of a conditional one
    (model routes on the state, which is copied too). Read from the compiled graph's edges, so
    a change to app/agent/graph.py cannot leave forks copying to the wrong next node."""
    plain: dict[str, str] = {}
    routed: dict[str, str] = {}
    for edge in compiled.get_graph().edges:
        if edge.source == START:
            continue
        (routed if edge.conditional else plain).setdefault(edge.target, edge.source)
    targets = {**routed, **plain}  # a plain edge wins: it does not depend on the state
    return {(() if target == END else (target,)): source for target, source in targets.items()}


_WRITER_OF = writers_of(build_graph())


def openai_messages(messages: list) -> list[dict]:
    """`messages` as OpenAI dicts: langchain-core messages converted, dicts kept as they are
    (converting a dict round-trips it through langchain-core, which rejects tool-call arguments
    that are not JSON: a model's malformed call must still be recorded as it was)."""
    return [m if isinstance(m, dict) else to_openai([m])[0] for m in messages]


def thread_config(thread_id: str, checkpoint_id: str | None = None, **metadata: Any) -> dict:
    """A LangGraph config for `thread_id` (at `checkpoint_id`: run or read from there);
    `metadata` is stored with every checkpoint the run writes."""
    configurable = {"thread_id": thread_id, **({"checkpoint_id": checkpoint_id} if checkpoint_id else {})}
    return {"configurable": configurable, **({"metadata": metadata} if metadata else {})}


def checkpoint_id_of(snapshot: StateSnapshot) -> str:
    return snapshot.config["configurable"]["checkpoint_id"]


async def seed_thread(graph: Any, thread_id: str, messages: list) -> str:
    """Write a first checkpoint holding `messages` (nothing pending) to `thread_id`; its id.
    For a branch with no base yet: a new main branch (no messages), an empty fork, or a
    branch whose history was recorded before checkpoints were (its turns' messages)."""
    config = await graph.aupdate_state(thread_config(thread_id), {"messages": from_openai(messages)},
                                       as_node="budget_exhausted")
    return config["configurable"]["checkpoint_id"]


async def copy_checkpoint(graph: Any, source: StateSnapshot, thread_id: str) -> str:
    """Copy `source` (a snapshot of another thread) into the new thread `thread_id`, with the
    same next node; the new checkpoint's id."""
    writer = _WRITER_OF.get(tuple(source.next))
    if writer is None:
        raise ValueError(f"no fork from a checkpoint whose next step is {source.next!r}")
    config = await graph.aupdate_state(thread_config(thread_id), source.values, as_node=writer)
    return config["configurable"]["checkpoint_id"]


async def snapshot_at(graph: Any, thread_id: str, checkpoint_id: str) -> StateSnapshot | None:
    """The state at `checkpoint_id` of `thread_id`; None when the thread has no such checkpoint."""
    snapshot = await graph.aget_state(thread_config(thread_id, checkpoint_id))
    return snapshot if snapshot.created_at is not None else None


def is_forkable(snapshot: StateSnapshot) -> bool:
    """A checkpoint a branch can start from: not an input checkpoint (the input is not applied
    there yet; fork from the checkpoint before it) and not inside a running node's subgraph."""
    return (snapshot.metadata or {}).get("source") != "input" and tuple(snapshot.next) in _WRITER_OF


async def list_checkpoints(graph: Any, thread_id: str) -> list[dict]:
    """The forkable checkpoints of `thread_id`, newest first, described for a person choosing one."""
    found = []
    async for snapshot in graph.aget_state_history(thread_config(thread_id)):
        if not is_forkable(snapshot):
            continue
        messages = snapshot.values.get("messages") or []
        parent = snapshot.parent_config["configurable"]["checkpoint_id"] if snapshot.parent_config else None
        found.append({"checkpoint_id": checkpoint_id_of(snapshot), "parent_checkpoint_id": parent,
                      "created_at": snapshot.created_at, "turn_id": snapshot.metadata.get("turn_id"),
                      "source": snapshot.metadata.get("source"), "step": snapshot.metadata.get("step"),
                      "next": list(snapshot.next), "message_count": len(messages),
                      "last_message": _summary(messages[-1]) if messages else None})
    return found


def _summary(message: Any) -> dict:
    openai = openai_messages([message])[0]
    calls = [c["function"]["name"] for c in openai.get("tool_calls") or []]
    content = openai.get("content")
    text = content if isinstance(content, str) else str(content or "")
    return {"role": openai["role"], "content": text[:200], "tool_calls": calls}
