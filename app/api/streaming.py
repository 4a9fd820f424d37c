"""Turn events as Server-Sent Events, or collected into one JSON answer."""

from __future__ import annotations

import asyncio
import json

from fastapi.responses import JSONResponse
from sse_starlette.sse import EventSourceResponse

from app.services.turn_replay import RecordedTurn
from app.services.turns import TurnHandle, TurnService


def event_stream(handle: TurnHandle | RecordedTurn) -> EventSourceResponse:
    """`event: <type>` / `data: <json>` per event; the stream ends after final, error or approval_request."""

    async def generate():
        async for event in handle.events():
            yield {"event": event["type"], "data": json.dumps(event, ensure_ascii=False)}

    return EventSourceResponse(generate())


async def collected(handle: TurnHandle, turns: TurnService) -> JSONResponse:
    """Wait for the run to stop; 200 with the turn and its events, 502 when the model backend failed."""
    events = await handle.collect()
    turn = (await asyncio.to_thread(turns.turn_public, handle.turn_id)).model_dump(mode="json")
    body = {"turn": turn, "events": events}
    error = next((e for e in events if e["type"] == "error"), None)
    if error is None:
        return JSONResponse(body)
    status = 502 if error["error_type"].startswith("model_backend") else 500
    return JSONResponse({"error": {"message": error["message"], "type": error["error_type"]}, **body},
                        status_code=status)
