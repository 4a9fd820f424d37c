"""A running turn's events, kept so that any number of readers can replay and follow them.

The turn's background task appends every event it emits (`emit`) and closes the log when it
stops (`close`); a reader (`events(start)`) gets everything from `start` on, then waits for
what comes next, until the log is closed. The response to the POST that started a turn is one
reader; `GET /api/turns/{id}/events` (a page rejoining after a reload) is another, and reading
never consumes anything, so a reader that leaves (a closed tab) changes nothing for the others.
Every event also goes to the turn's journal in the database, for readers in other workbench
processes (app/services/turn_journal.py).

The events (each a dict with "type"; app/services/turns.py emits them):
  turn            {turn_id, run_id, session_id, branch_id, parent_turn_id, resumed, retry_of}
  token           {text}
  compacted       {step, span_id, tokens_before, tokens_after, reduced_turns, dropped_turns}
                  (before a model call whose history was compacted to fit the context)
  model_call      {step, span_id, prompt_tokens, completion_tokens, cached_tokens, cache_source,
                   draft_n, draft_n_accepted (speculative decoding's, when the server reports them),
                   ttft_ms, duration_ms, finish_reason}
  tool_call       {tool_call_id, name, arguments (JSON text), step}
  retry           {step, reason ("tool_call_cut"), cut_at_tokens, max_tokens, span_id}
                  (the step's reply was cut inside a tool call: nothing ran, it runs again with more room)
  tool_result     {tool_call_id, name, content, error, trimmed, full_chars, artifact_id, duration_ms, span_id}
                  (again with "fitted": true when the step's results were cut to fit the context together)
  approval_request{approval_id, turn_id, tool_call_id, tool_name, arguments}    (the stream ends here)
  final           {turn_id, branch_id, content, outcome, steps}                  (the stream ends here)
  error           {turn_id, message, error_type, retryable}                      (the stream ends here)
  cancelled       {turn_id, message}                                              (the stream ends here)

Cancellation (`request_cancel`) only ever cancels the task while the graph runs (`phase`
"graph"): cancelled there, the turn is marked `cancelled` by the task itself. Before that the
task sees the request and stops at the start; after that (recording the outcome) the turn
ends as it was going to, and the cancel request is answered with that outcome.

Everything here runs on the event loop's thread (asyncio primitives are not thread-safe).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from app.services.turn_journal import TurnJournal


@dataclass
class TurnHandle:
    """A running (or resumed) turn: its ids, its event log and its task."""

    turn_id: str
    run_id: str
    log: list[dict] = field(default_factory=list)
    closed: bool = False
    task: asyncio.Task | None = None
    phase: str = "starting"  # then "graph" (running the agent), then "finishing" (recording how it ended)
    cancel_requested: bool = False
    journal: TurnJournal | None = None  # the copy other processes read (app/services/turn_journal.py)
    _wake: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def emit(self, event: dict, journal: bool = True) -> None:
        """Append `event` and wake the readers; `journal` False: the event's row was written
        already, with the change it tells of (a pause: app/services/turns.py)."""
        self.log.append(event)
        if journal and self.journal is not None:
            self.journal.add(event)
        self._notify()

    def close(self) -> None:
        """No event follows: readers stop once they have read the log."""
        self.closed = True
        if self.journal is not None:
            self.journal.close()
        self._notify()

    def _notify(self) -> None:
        wake, self._wake = self._wake, asyncio.Event()
        wake.set()

    async def events(self, start: int = 0) -> AsyncIterator[dict]:
        """The events from index `start` on, as they come, until the log is closed."""
        index = start
        while True:
            wake = self._wake  # taken before reading: an emit after this point sets it
            while index < len(self.log):
                yield self.log[index]
                index += 1
            if self.closed:
                return
            await wake.wait()

    async def collect(self) -> list[dict]:
        return [event async for event in self.events()]

    def request_cancel(self) -> None:
        """Ask the turn to stop: in the graph its task is cancelled (the model request is closed,
        the turn ends `cancelled`); before it, the task stops as it gets there; once finishing,
        nothing changes (the turn ends as it was going to). Asked again, nothing more happens: a
        second cancel of the task would cut short the recording of the first."""
        if self.cancel_requested or self.phase == "finishing" or self.task is None or self.task.done():
            return
        self.cancel_requested = True
        if self.phase == "graph":
            self.task.cancel()
