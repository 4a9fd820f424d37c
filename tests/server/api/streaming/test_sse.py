"""Server-sent-event frames (no model)."""

from __future__ import annotations

from server.api.protocols.openai_body import ServedModel
from server.api.protocols.openai_chat.reply import chat_chunk
from server.api.streaming.sse import TEXT_SLOT, sse, sse_with_text


def test_sse_with_text_frames_equal_full_serialization():
    served = ServedModel('model "x"', "fp_0123")
    frame = sse_with_text(chat_chunk("id-1", served, 7, {"content": TEXT_SLOT}))
    for text in ["hello", 'quote " and \\ backslash', "line\nbreak", "\x00", "héllo ☃", ""]:
        assert frame(text) == sse(chat_chunk("id-1", served, 7, {"content": text}))
