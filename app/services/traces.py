"""Reading traces back: spans with a token summary, artifacts, and the request manifest."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, cast

from sqlalchemy.engine import Engine
from sqlalchemy.orm import QueryableAttribute, defer
from sqlmodel import Session, col, select

from app.db.models import AgentSession, Artifact, Span, SpanPublic
from app.errors import NotFound
from harness.manifest import ManifestLine


def _naive_utc(moment: datetime) -> datetime:
    # SQLite hands datetimes back without tzinfo; compare everything as naive UTC.
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC).replace(tzinfo=None)
    return moment


def session_spans(db: Session, session: AgentSession, turn_id: str | None = None,
                  branch_id: str | None = None, bodies: bool = True) -> list[Span]:
    """The spans of `session` (of one turn, one branch) in start order; without `bodies` their
    request bodies (a model span's whole prompt: the bulk of a trace) are not even read."""
    query = select(Span).where(Span.session_id == session.id)
    if not bodies:
        # SQLModel types a column attribute as its value (a dict here); it is the mapped attribute
        query = query.options(defer(cast(QueryableAttribute[Any], Span.request), raiseload=True))
    if turn_id:
        query = query.where(Span.turn_id == turn_id)
    if branch_id:
        query = query.where(Span.branch_id == branch_id)
    return list(db.exec(query.order_by(col(Span.started_at))).all())


def summarize(spans: list[Span]) -> dict:
    """Token and call totals; computed = prompt tokens the server did not take from its cache."""
    model = [s for s in spans if s.kind == "model" and s.status == "ok"]
    prompt = sum((s.attributes or {}).get("gen_ai.usage.input_tokens") or 0 for s in model)
    cached = sum((s.attributes or {}).get("gen_ai.usage.cache_read.input_tokens") or 0 for s in model)
    output = sum((s.attributes or {}).get("gen_ai.usage.output_tokens") or 0 for s in model)
    return {
        "model_calls": sum(1 for s in spans if s.kind == "model"),
        "model_errors": sum(1 for s in spans if s.kind == "model" and s.status == "error"),
        "tool_calls": sum(1 for s in spans if s.kind == "tool"),
        "tool_errors": sum(1 for s in spans if s.kind == "tool" and s.status == "error"),
        "input_tokens": prompt,
        "cached_input_tokens": cached,
        "computed_input_tokens": prompt - cached,
        "output_tokens": output,
        "cache_hit_ratio": round(cached / prompt, 4) if prompt else None,
    }


def trace(db: Session, session: AgentSession, turn_id: str | None = None, branch_id: str | None = None,
          bodies: bool = True) -> dict:
    """Spans and their token summary; without `bodies` each span's `request` is null (the
    span's own endpoint, `span_public`, has it)."""
    spans = session_spans(db, session, turn_id, branch_id, bodies)
    return {"session_id": session.id, "summary": summarize(spans), "bodies": bodies,
            "spans": [_public(s, bodies) for s in spans]}


def _public(span: Span, body: bool) -> dict:
    fields = {name: getattr(span, name) for name in SpanPublic.model_fields if body or name != "request"}
    return SpanPublic.model_validate({"request": None, **fields}).model_dump(mode="json")


def span_public(db: Session, span_id: str) -> dict:
    """One span in full, request body included; NotFound for an unknown id."""
    span = db.get(Span, span_id)
    if span is None:
        raise NotFound(f"unknown span {span_id!r}", "unknown_span")
    return _public(span, True)


def session_artifact_text(engine: Engine, session_id: str, artifact_id: str) -> str:
    """The full text of an artifact of this session (the `read_artifact` tool's reader);
    LookupError for an unknown id or one of another session."""
    with Session(engine) as db:
        artifact = db.get(Artifact, artifact_id)
    if artifact is None or artifact.session_id != session_id:
        raise LookupError(artifact_id)
    return artifact.content


def get_artifact(db: Session, artifact_id: str) -> Artifact:
    artifact = db.get(Artifact, artifact_id)
    if artifact is None:
        raise NotFound(f"unknown artifact {artifact_id!r}", "unknown_artifact")
    return artifact


def manifest_lines(db: Session, session: AgentSession, branch_id: str | None = None) -> list[ManifestLine]:
    """One line per model request that got an answer, in the order they were sent.

    Failed requests (backend down) are left out: there is nothing to replay them against. A request
    that follows another model request of its turn carries ``after_s``: the seconds from that one's end
    to its own start, the time the turn's tools (and approvals) took, which a replay waits again
    (harness/serving/runner.py). A turn's first request carries none: the user's pause is not replayed.
    """
    start = _naive_utc(session.created_at)
    lines = []
    ended: dict[tuple[str, str], datetime] = {}  # (branch, turn) -> when its last model request ended
    for span in session_spans(db, session, branch_id=branch_id):
        if span.kind != "model" or span.status != "ok" or not span.request:
            continue
        began = _naive_utc(span.started_at)
        key = (span.branch_id, span.turn_id)
        after = round(max(0.0, (began - ended[key]).total_seconds()), 3) if key in ended else None
        if span.duration_ms is not None:
            ended[key] = began + timedelta(milliseconds=span.duration_ms)
        lines.append(ManifestLine(
            t=round(max(0.0, (began - start).total_seconds()), 6),
            session_id=session.id, branch_id=span.branch_id, body=span.request,
            expected_output_tokens=(span.attributes or {}).get("gen_ai.usage.output_tokens"), after_s=after))
    return lines
