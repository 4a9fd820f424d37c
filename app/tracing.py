"""Run traces: one span per model call and per tool call, stored in the database, and a
"compacted" span before each model call whose history had to be compacted to fit.

Span attributes use the OpenTelemetry GenAI semantic-convention names
(https://opentelemetry.io/docs/specs/semconv/gen-ai/); what GenAI has no name for uses an
``arbor.`` prefix. With OTLP export on (app/telemetry/otlp.py) each span is also exported as it
is recorded, into its turn's trace.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any
from urllib.parse import urlparse

from sqlalchemy.engine import Engine
from sqlmodel import Session

from app.agent.context_budget import FittedRequest
from app.agent.model_client import ModelCallResult
from app.db.models import Artifact, Span, new_id, utcnow
from app.telemetry import otlp


def model_span_attributes(body: dict, result: ModelCallResult | None, base_url: str, *,
                          session_id: str, branch_id: str, step: int, error_type: str | None) -> dict:
    """GenAI attributes of a chat call (`result` is None when the call failed)."""
    server = urlparse(base_url)
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": body.get("model"),
        "gen_ai.request.max_tokens": body.get("max_tokens"),
        "gen_ai.conversation.id": session_id,
        "server.address": server.hostname,
        "server.port": server.port,
        "arbor.branch.id": branch_id,
        "arbor.step": step,
        "arbor.request.tool_choice": body.get("tool_choice", "auto") if body.get("tools") else None,
        "arbor.cache.hint.state": (body.get("cache") or {}).get("state"),
    }
    if "temperature" in body:
        attrs["gen_ai.request.temperature"] = body["temperature"]
    if error_type:
        attrs["error.type"] = error_type
    if result is not None:
        attrs.update({
            "gen_ai.response.model": result.model,
            "gen_ai.response.finish_reasons": [result.finish_reason] if result.finish_reason else [],
            "gen_ai.usage.input_tokens": result.prompt_tokens,
            "gen_ai.usage.output_tokens": result.completion_tokens,
            "gen_ai.usage.cache_read.input_tokens": result.cached_tokens,
            "arbor.ttft_ms": result.ttft_ms,
            "arbor.tool_calls": len(result.tool_calls),
        })
        if result.prompt_tokens is not None:
            attrs["arbor.usage.computed_input_tokens"] = result.prompt_tokens - (result.cached_tokens or 0)
        if result.timings and result.timings.get("draft_n") is not None:
            attrs["arbor.speculative.draft_tokens"] = result.timings.get("draft_n")
            attrs["arbor.speculative.accepted_tokens"] = result.timings.get("draft_n_accepted")
        if result.cache:
            attrs["arbor.cache.source"] = result.cache.get("source")
            attrs["arbor.cache.reused_tokens"] = result.cache.get("reused_tokens")
            attrs["arbor.cache.restored_bytes"] = result.cache.get("restored_bytes")
            attrs["arbor.cache.restore_ms"] = result.cache.get("restore_ms")
    return {k: v for k, v in attrs.items() if v is not None}


def tool_span_attributes(name: str, call_id: str, *, branch_id: str, error_type: str | None,
                         trimmed: bool, full_chars: int | None, context_chars: int | None,
                         artifact_id: str | None, requires_approval: bool, decision: str | None,
                         ranking: dict | None = None) -> dict:
    """GenAI attributes of a tool call, and what its trimming did: with `ranking` (a trimmed
    result whose lists were cut: TrimmedResult.ranking_report) the question they were ranked by
    and how many items were kept, and why (`arbor.tool.ranking.*`; the lists in the span's response)."""
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": name,
        "gen_ai.tool.call.id": call_id,
        "gen_ai.tool.type": "function",
        "arbor.branch.id": branch_id,
        "arbor.tool.trimmed": trimmed,
        "arbor.tool.full_chars": full_chars,
        "arbor.tool.context_chars": context_chars,
        "arbor.artifact.id": artifact_id,
        "arbor.tool.requires_approval": requires_approval,
        "arbor.approval.decision": decision,
    }
    if error_type:
        attrs["error.type"] = error_type
    attrs.update(ranking_attributes(ranking))
    return {k: v for k, v in attrs.items() if v is not None}


def ranking_attributes(ranking: dict | None) -> dict:
    """`arbor.tool.ranking.*` of a cut result (flat, OTLP takes no nested values); {} when none."""
    if not ranking:
        return {}
    attrs = {f"arbor.tool.ranking.{key}": ranking[key]
             for key in ("question", "lists_cut", "items", "kept_count", "relevant", "flagged", "leading",
                         "dropped_relevant", "dropped_flagged")}
    attrs["arbor.tool.ranking.terms"] = list(ranking.get("terms") or [])
    return attrs


def tool_schema_attributes(sizes: dict | None) -> dict:
    """`arbor.tools.*` of a model call: whether its tool schemas were compacted and their sizes,
    JSON characters as sent and in full (app/agent/tool_schemas.py)."""
    if not sizes:
        return {}
    return {"arbor.tools.count": sizes["count"], "arbor.tools.compacted": sizes["compacted"],
            "arbor.tools.schema_chars": sizes["chars"], "arbor.tools.full_schema_chars": sizes["full_chars"]}


def compaction_span_attributes(fitted: FittedRequest, *, branch_id: str, step: int, retry: bool) -> dict:
    """What a compaction did: its level (messages reduced / dropped at the front), whether this
    call stepped it forward, and token counts (the server's when `arbor.compaction.exact`, else
    the workbench's estimates, margin included)."""
    done, limit = fitted.compaction, fitted.limit
    assert done is not None and limit is not None  # a compacted request had a known limit
    return {
        "arbor.operation.name": "compact_context",
        "arbor.branch.id": branch_id,
        "arbor.step": step,
        "arbor.compaction.tokens_before": done.tokens_before,
        "arbor.compaction.tokens_after": done.tokens_after,
        "arbor.compaction.past_turns": done.past_turns,
        "arbor.compaction.reduced_turns": done.reduced_turns,
        "arbor.compaction.dropped_turns": done.dropped_turns,
        "arbor.compaction.retry": retry,
        "arbor.compaction.stepped": done.stepped,
        "arbor.compaction.exact": fitted.exact,
        "arbor.compaction.level.reduced_messages": done.level.reduced,
        "arbor.compaction.level.dropped_messages": done.level.dropped,
        "arbor.context.limit": limit.n_ctx,
        "arbor.context.limit_source": limit.source,
        "gen_ai.request.max_tokens": fitted.max_tokens,
    }


class TraceRecorder:
    """Writes the spans and artifacts of one run (ids fixed at construction)."""

    def __init__(self, engine: Engine, *, session_id: str, branch_id: str, turn_id: str, run_id: str,
                 base_url: str) -> None:
        self.engine = engine
        self.session_id, self.branch_id, self.turn_id, self.run_id = session_id, branch_id, turn_id, run_id
        self.base_url = base_url

    async def _save(self, row: Any, traceparent: str | None = None) -> str:
        # The graph's nodes are async: the write runs in a worker thread, off the event loop.
        return await asyncio.to_thread(self._write, row, traceparent)

    def _write(self, row: Any, traceparent: str | None = None) -> str:
        row_id = row.id  # read before commit expires the instance
        telemetry = otlp.active()
        if telemetry is not None and isinstance(row, Span):  # exported as recorded (app/telemetry/otlp.py)
            telemetry.record(turn_id=row.turn_id, name=row.name, kind=row.kind, started_at=row.started_at,
                             duration_ms=row.duration_ms, attributes={"gen_ai.conversation.id": row.session_id,
                                                                      **(row.attributes or {})},
                             error=row.error, traceparent_value=traceparent)
        with Session(self.engine) as db:
            db.add(row)
            db.commit()
        return row_id

    async def model_call(self, *, step: int, body: dict, started_at: datetime, duration_ms: float,
                   result: ModelCallResult | None = None, error: str | None = None,
                   error_type: str | None = None, tool_schemas: dict | None = None) -> str:
        """Record a chat call; `body` is the exact request body; `tool_schemas` the sizes of its
        tools as sent and in full (app/agent/tool_schemas.py: `schema_sizes`). Returns the span id."""
        response = None
        if result is not None:
            response = {
                "message": result.assistant_message(),
                "finish_reason": result.finish_reason,
                "usage": {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens,
                          "cached_tokens": result.cached_tokens},
                "timings": result.timings,
                "cache": result.cache,
            }
        span = Span(
            id=new_id(), session_id=self.session_id, branch_id=self.branch_id, turn_id=self.turn_id,
            run_id=self.run_id, kind="model", name=f"chat {body.get('model')}",
            status="error" if error else "ok", error=error, started_at=started_at, duration_ms=duration_ms,
            ttft_ms=result.ttft_ms if result else None,
            attributes={**model_span_attributes(body, result, self.base_url, session_id=self.session_id,
                                                branch_id=self.branch_id, step=step, error_type=error_type),
                        **tool_schema_attributes(tool_schemas)},
            request=body, response=response,
        )
        return await self._save(span, result.traceparent if result is not None else None)

    async def compaction(self, *, step: int, fitted: FittedRequest, retry: bool = False) -> str:
        """Record that the request of model step `step` carries a compacted history. Returns the span id."""
        done = fitted.compaction
        assert done is not None  # compacted
        span = Span(
            id=new_id(), session_id=self.session_id, branch_id=self.branch_id, turn_id=self.turn_id,
            run_id=self.run_id, kind="compaction", name="compacted", started_at=utcnow(), duration_ms=0.0,
            attributes=compaction_span_attributes(fitted, branch_id=self.branch_id, step=step, retry=retry),
            response={"summary": f"{done.tokens_before} -> {done.tokens_after} tokens "
                                 f"({'counted by the server' if fitted.exact else 'estimated'}"
                                 f"{', stepped forward' if done.stepped else ''}): "
                                 f"{done.reduced_turns} turn(s) reduced, {done.dropped_turns} dropped of "
                                 f"{done.past_turns}"},
        )
        return await self._save(span)

    async def tool_call(self, *, name: str, call_id: str, arguments: Any, started_at: datetime, duration_ms: float,
                  context_text: str, error: str | None, error_type: str | None, trimmed: bool,
                  full_chars: int | None, artifact_id: str | None, requires_approval: bool,
                  decision: str | None, ranking: dict | None = None) -> str:
        span = Span(
            id=new_id(), session_id=self.session_id, branch_id=self.branch_id, turn_id=self.turn_id,
            run_id=self.run_id, kind="tool", name=f"execute_tool {name}",
            status="error" if error else "ok", error=error, started_at=started_at, duration_ms=duration_ms,
            attributes=tool_span_attributes(name, call_id, branch_id=self.branch_id, error_type=error_type,
                                            trimmed=trimmed, full_chars=full_chars,
                                            context_chars=len(context_text), artifact_id=artifact_id,
                                            requires_approval=requires_approval, decision=decision,
                                            ranking=ranking),
            request={"arguments": arguments},
            response={"content": context_text, "trimmed": trimmed, "full_chars": full_chars, "ranking": ranking},
            artifact_id=artifact_id,
        )
        return await self._save(span)

    async def tool_fitted(self, *, span_id: str, context_text: str, full_chars: int, artifact_id: str | None,
                          ranking: dict | None) -> None:
        """A result cut again when the step's results were fitted together (app/agent/result_fit.py):
        its span now says what the model sees (the text, its artifact, what the cut kept, and
        `arbor.tool.fitted`). Only the database's span changes: one exported over OTLP already
        went out as first recorded."""
        await asyncio.to_thread(self._update_tool, span_id, context_text, full_chars, artifact_id, ranking)

    def _update_tool(self, span_id: str, context_text: str, full_chars: int, artifact_id: str | None,
                     ranking: dict | None) -> None:
        with Session(self.engine) as db:
            span = db.get(Span, span_id)
            if span is None:
                return
            attrs = {k: v for k, v in (span.attributes or {}).items() if not k.startswith("arbor.tool.ranking.")}
            attrs.update({"arbor.tool.trimmed": True, "arbor.tool.fitted": True, "arbor.tool.full_chars": full_chars,
                          "arbor.tool.context_chars": len(context_text), **ranking_attributes(ranking)})
            if artifact_id is not None:
                attrs["arbor.artifact.id"] = artifact_id
            # new dicts, not changed ones: the JSON columns see a new value and write it
            span.attributes = attrs
            span.response = {**(span.response or {}), "content": context_text, "trimmed": True,
                             "full_chars": full_chars, "ranking": ranking, "fitted": True}
            span.artifact_id = artifact_id or span.artifact_id
            db.add(span)
            db.commit()

    async def artifact(self, *, artifact_id: str, tool_name: str, call_id: str, content: str,
                       context_chars: int) -> None:
        await self._save(Artifact(id=artifact_id, session_id=self.session_id, turn_id=self.turn_id, tool_name=tool_name,
                            tool_call_id=call_id, content=content, chars=len(content),
                            context_chars=context_chars, created_at=utcnow()))
