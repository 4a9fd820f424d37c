"""`token` events for the client, taken from the chat model's callbacks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from langchain_core.callbacks import AsyncCallbackHandler


class TokenEvents(AsyncCallbackHandler):
    """Writes each new token of a chat model run as ``{"type": "token", "text": ...}``.

    Awaited in order by the callback manager, so the client sees the text as it was produced.
    """

    def __init__(self, write: Callable[[dict], None]) -> None:
        self.write = write

    async def on_llm_new_token(self, token: str | list[str | dict[str, Any]], **kwargs: Any) -> None:
        self.write({"type": "token", "text": token})
