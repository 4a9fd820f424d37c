"""Stored responses of the Responses API (server.api.protocols.openai_responses), part of the
server's state: what `previous_response_id`, `GET` and `DELETE /v1/responses/{id}` read.

Each stored response keeps its own new input items and its response body (whose `output` are
its output items), and the id of the response it continued; a conversation is the chain from
its first response to its last. Bounded by count and by bytes (the JSON size of what is kept),
oldest first; continuing a response makes its whole chain the newest, so the conversations in
use stay and the abandoned ones go. A chain whose start was evicted or deleted can no longer be
continued (the route answers 404, as for an unknown id).

Used from the event loop only (no lock): every route that touches it is a coroutine that does
not await while it reads or writes.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StoredResponse:
    id: str
    root_id: str  # the chain's first response: the conversation's cache session
    previous_id: str | None
    input_items: list[dict[str, Any]]  # this response's new input, as request items
    body: dict[str, Any]  # the Response object as returned (its output items included)

    @property
    def size(self) -> int:
        """Bytes it counts against the store's budget: its JSON, as it was sent and received."""
        return len(json.dumps(self.input_items, ensure_ascii=False).encode()) + len(
            json.dumps(self.body, ensure_ascii=False).encode())


class ResponseStore:
    def __init__(self, max_responses: int, max_bytes: int):
        """`max_responses` 0 stores nothing (every `previous_response_id` is then unknown)."""
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, tuple[StoredResponse, int]] = OrderedDict()  # oldest first
        self.bytes = 0
        self.evicted = 0  # responses dropped to make room
        self.refused = 0  # responses larger than the whole byte budget, never stored

    def __len__(self) -> int:
        return len(self._items)

    def put(self, stored: StoredResponse) -> bool:
        """Keep `stored` as the newest, evicting the oldest until both bounds hold; False when
        it alone exceeds a bound (it is not kept)."""
        size = stored.size
        if self.max_responses == 0 or size > self.max_bytes:
            self.refused += 1
            return False
        self.delete(stored.id)
        while self._items and (len(self._items) >= self.max_responses or self.bytes + size > self.max_bytes):
            _, (_, dropped) = self._items.popitem(last=False)
            self.bytes -= dropped
            self.evicted += 1
        self._items[stored.id] = (stored, size)
        self.bytes += size
        return True

    def get(self, response_id: str) -> StoredResponse | None:
        got = self._items.get(response_id)
        return got[0] if got is not None else None

    def delete(self, response_id: str) -> bool:
        got = self._items.pop(response_id, None)
        if got is None:
            return False
        self.bytes -= got[1]
        return True

    def chain(self, response_id: str) -> list[StoredResponse] | None:
        """The conversation that ends with `response_id`, first response first, made the newest
        in the eviction order; None when it or any response before it is no longer stored."""
        out: list[StoredResponse] = []
        seen: set[str] = set()
        at: str | None = response_id
        while at is not None:
            got = self.get(at)
            if got is None or at in seen:  # a cycle cannot be built by the API; refuse rather than loop
                return None
            seen.add(at)
            out.append(got)
            at = got.previous_id
        out.reverse()
        for r in out:
            self._items.move_to_end(r.id)
        return out

    def stats(self) -> dict[str, int]:
        return {"max_responses": self.max_responses, "max_bytes": self.max_bytes, "responses": len(self._items),
                "bytes": self.bytes, "evicted": self.evicted, "refused": self.refused}
