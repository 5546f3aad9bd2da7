"""The Job page (`/ui/jobs/{id}`) and its actions: one job, as the API shows it to the session's token.

Reads go through the functions the API's routes call: `visible_job` + `job_out` (what
`GET /v1/jobs/{id}` answers, the spec's secrets redacted), `list_events`, `ops.explain.explain_job`
(why it is pending), `ops.logs.follow_logs` (per-rank logs, live). A job the session may not see is
a 404 page in the API's words.
"Why pending" refreshes itself every `PENDING_REFRESH_S` seconds from `/ui/jobs/{id}/pending` while
the job waits (its position and reasons change as the queue moves), and stops once it no longer waits.

Actions are POSTs with the page's CSRF token, answered with a redirect back to the page:

- `cancel`: `cancel_job`, as `POST /v1/jobs/{id}/cancel`;
- `resubmit`: a new job from the stored spec through the API's submit path (`submission.submit`:
  the same planning, permission and priority checks as `POST /v1/jobs`);
- `priority` (admins only): `set_priority`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any

import yaml
from fastapi import APIRouter, Form, Path, Query, Request
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session
from starlette.responses import HTMLResponse, RedirectResponse, Response

from service.api.deps import Db
from service.api.errors import ApiError
from service.api.ops.explain import explain_job
from service.api.ops.logs import follow_logs
from service.api.schemas import EventOut, JobOut
from service.api.sse import sse_message
from service.api.streams import EventStreamResponse
from service.api.submission import submit
from service.api.ui.charts import Series, memory_segments, series
from service.api.ui.errors import UiError
from service.api.ui.live import Batch, live_response
from service.api.ui.render import fragment_text, page
from service.api.ui.session import Csrf, Polled, Signed, SignedAdmin, UiSession, stream_auth
from service.api.views import event_out, job_out
from service.lifecycle import TERMINAL, WAITING
from service.profiles.models import ProfileSummary
from service.scheduling.decisions import Explanation
from service.scheduling.snapshot import SnapshotParams
from service.store.jobs import cancel_job, list_events, set_priority, visible_job
from service.store.models import Measurement, utcnow
from service.store.tokens import Conflict, Principal
from service.store.vocab import JobStatus, MeasurementKind, Role

router = APIRouter(tags=["ui"], include_in_schema=False)
JobId = Annotated[int, Path(ge=1, le=2**63 - 1)]
MAX_HEARTBEATS = 2000
#: How often the page's "why pending" refreshes itself while the job waits (the queue moves under it).
PENDING_REFRESH_S = 10

#: Predicted vs measured rows: label, the report's predicted key, measured key, ratio key, unit.
COMPARED = [("Parameters", "params", "params", "params", "bytes"),
            ("Gradients", "grads", "grads", "grads", "bytes"),
            ("Optimizer state", "optimizer", "optimizer", "optimizer", "bytes"),
            ("Peak allocated", "peak_allocated", "peak", "peak", "bytes"),
            ("Peak reserved", "peak_reserved", "reserved", "reserved", "bytes"),
            ("Step time", "step_s", "step_s", "step_s", "seconds"),
            ("Tokens/s", "tokens_per_s", "tokens_per_s", "tokens_per_s", "rate")]


@dataclass(frozen=True, slots=True)
class Moment:
    """One point of the timeline, with the time since the previous one."""

    label: str
    at: datetime | None
    since_previous_s: float | None
    note: str = ""


def timeline(job: JobOut, events: list[EventOut]) -> list[Moment]:
    """Queued, admitted, started, finished; the durations between them show the time spent waiting."""
    def first(*kinds: str) -> datetime | None:
        return next((e.at for e in events if e.kind in kinds), None)

    admitted = first("job.submitting", "job.pending")
    started = first("job.running")
    finished = job.finished_at
    points = [("Queued", job.created_at, ""), ("Admitted", admitted, "handed to the dispatcher"),
              ("Started", started, "running on its backend"),
              ("Finished", finished, job.status.value.lower() if finished else "")]
    out, previous = [], None
    for label, at, note in points:
        since: float | None = (at - previous).total_seconds() if at is not None and previous is not None else None
        out.append(Moment(label, at, since, note))
        previous = at or previous
    return out


def heartbeats(session: Session, job_id: int) -> tuple[list[Series], int]:
    """Loss and tokens/s over steps from the job's heartbeats (the newest `MAX_HEARTBEATS`), and the
    newest heartbeat's id (0: none)."""
    rows = list(session.scalars(select(Measurement).where(Measurement.job_id == job_id,
                                                          Measurement.kind == MeasurementKind.HEARTBEAT)
                                .order_by(Measurement.id.desc()).limit(MAX_HEARTBEATS)))
    rows.reverse()
    steps = [_int(r.data.get("step"), i + 1) for i, r in enumerate(rows)]
    charts = [series("Loss", steps, [_float(r.data.get("loss")) for r in rows]),
              series("Tokens/s", steps, [_float(r.data.get("tokens_per_s")) for r in rows])]
    return [c for c in charts if c is not None], rows[-1].id if rows else 0


def _float(value: object) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else float("nan")


def _int(value: object, default: int) -> int:
    """`value` when it is an integer, else `default` (rows stored before measurements were checked)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def report_losses(report: dict[str, Any] | None) -> list[Series]:
    """Without two heartbeats: the loss of every step from the final report."""
    losses = (report or {}).get("losses") or []
    losses = losses if isinstance(losses, list) else []
    start = _int((report or {}).get("start_step"), 0)
    line = series("Loss", list(range(start + 1, start + 1 + len(losses))), [_float(v) for v in losses])
    return [line] if line is not None else []


#: The profile's verdict in words (`service.profiles.models.Bound`).
VERDICTS = {"compute": "compute-bound", "communication": "communication-bound", "memory": "memory-bound",
            "input": "input-bound (waiting for data)", "host_launch": "host-launch-bound (CPU launch overhead)",
            "idle": "mostly idle", "balanced": "balanced (no single bottleneck)"}


def profile_of(job: JobOut) -> ProfileSummary | None:
    found = job.measurements.get(MeasurementKind.PROFILE)
    if found is None:
        return None
    try:
        return ProfileSummary.model_validate(found.data)
    except ValidationError:
        return None


def explain(request: Request, db: Db, principal: Principal, job_id: int, status: JobStatus) -> Explanation | None:
    """Why the job waits (`GET /v1/jobs/{id}/explain`), for a job that waits; None otherwise."""
    if status not in WAITING:
        return None
    settings = request.app.state.settings
    try:
        return explain_job(db, principal, job_id, SnapshotParams.from_settings(settings),
                           max_age_s=settings.queue_view_max_age_s)
    except ApiError:
        return None


def sections(session: Session, principal: Principal, job_id: int) -> dict[str, Any]:
    """Everything the page's sections show, read in the caller's transaction."""
    row = visible_job(session, principal, job_id, detail=True)
    job = job_out(session, row)
    events = [event_out(e) for e in list_events(session, row, limit=1000)]
    charts, beat = heartbeats(session, job_id)
    report = job.measurements.get(MeasurementKind.REPORT)
    report_data = report.data if report else None
    if not charts:
        charts = report_losses(report_data)
    return {"job": job, "events": events, "timeline": timeline(job, events), "charts": charts, "beat": beat,
            "report": report_data, "compared": COMPARED, "profile": profile_of(job), "verdicts": VERDICTS,
            "segments": memory_segments(job.plan.memory), "terminal": job.status in TERMINAL,
            "spec_yaml": yaml.safe_dump(json.loads(job.spec.model_dump_json(exclude_none=True)), sort_keys=False),
            "last_event": events[-1].id if events else 0, "now": utcnow()}


#: Only this global rank's log lines; empty (the form's "every rank") or absent: all of them.
RankQ = Annotated[str | None, Query(pattern=r"^[0-9]{0,7}$", description="Only this global rank's log lines.")]


def _rank(value: str | None) -> int | None:
    return int(value) if value else None


@router.get("/ui/jobs/{job_id}")
def job_page(job_id: JobId, request: Request, session: Signed, db: Db, rank: RankQ = None) -> Response:
    """The job; `rank` narrows its live logs to one global rank (every rank, merged, without it)."""
    with db.begin() as tx:
        context = sections(tx, session.principal, job_id)
    job: JobOut = context["job"]
    return page(request, session, "job.html", title=f"Job {job.id}: {job.name}",
                pending=explain(request, db, session.principal, job.id, job.status),
                pending_refresh_s=PENDING_REFRESH_S, is_admin=session.is_admin, rank=_rank(rank),
                ranks=range(job.plan.layout.world_size), **context)


@router.get("/ui/jobs/{job_id}/pending")
def job_pending(job_id: JobId, request: Request, session: Polled, db: Db) -> Response:
    """The "why pending" section as it is now (position, reasons, ETA), for the page to poll; a
    placeholder that polls no more once the job no longer waits. Another team's job: the 404 page."""
    with db.begin() as tx:
        job = visible_job(tx, session.principal, job_id)
        status = job.status
    pending = explain(request, db, session.principal, job_id, status)
    return HTMLResponse(fragment_text("_job_pending.html", job={"id": job_id}, pending=pending,
                                      pending_refresh_s=PENDING_REFRESH_S))


def _render(name: str, session: UiSession, context: dict[str, Any]) -> str:
    return fragment_text(name, csrf=session.csrf, is_admin=session.is_admin, **context)


@router.get("/ui/jobs/{job_id}/live")
def job_live(job_id: JobId, request: Request, session: Polled, db: Db,
             after: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0,
             beat: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0) -> Response:
    """New events appended to the history; the overview, attempts, results and chart re-rendered
    when an event or a heartbeat came after the page's own (`after`: its newest event, `beat`: its
    newest heartbeat), so a form being filled in is not replaced by the same section when the stream
    starts. Ends (`end`) once the job has ended and all is sent."""
    with db.begin() as tx:
        visible_job(tx, session.principal, job_id)  # a 404 page before any stream
    seen_beat = beat

    def step(tx: Session, principal: Principal, cursor: int) -> Batch:
        nonlocal seen_beat
        batch = Batch(cursor=cursor)
        row = visible_job(tx, principal, job_id)
        fresh = [event_out(e) for e in list_events(tx, row, after=cursor)]
        beat = tx.scalar(select(Measurement.id).where(Measurement.job_id == job_id,
                                                      Measurement.kind == MeasurementKind.HEARTBEAT)
                         .order_by(Measurement.id.desc()).limit(1)) or 0
        if fresh or beat != seen_beat:
            context = sections(tx, principal, job_id)
            for event in fresh:
                batch.add("job-events", fragment_text("_job_event.html", event=event), swap="append")
            for name in ("overview", "attempts", "results", "chart"):
                batch.add(f"job-{name}", _render(f"_job_{name}.html", session, context))
            if context["job"].status not in WAITING:
                batch.add("job-pending", "")  # it no longer waits: "why pending" is gone, not stale
            if fresh:
                batch.cursor = fresh[-1].id
            seen_beat = beat
        batch.done = row.status in TERMINAL and not fresh
        return batch

    return live_response(request, session, step, after)


def _log_html(message: str) -> tuple[str, dict[str, Any], str | None]:
    """(event, data, id) of one SSE message that `follow_logs` wrote."""
    kind, data, ident = "", "{}", None
    for line in message.splitlines():
        if line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            data = line[6:]
        elif line.startswith("id: "):
            ident = line[4:]
    return kind, json.loads(data), ident


@router.get("/ui/jobs/{job_id}/logs/live")
def logs_live(job_id: JobId, request: Request, session: Polled, db: Db, rank: RankQ = None) -> Response:
    """Every rank's lines (or only `rank`'s), merged in the order they are read, each with its rank:
    the API's log stream (`follow_logs`, the same as `GET /v1/jobs/{id}/logs?follow=true`) as HTML."""
    reader = request.app.state.log_reader
    with db.begin() as tx:
        visible_job(tx, session.principal, job_id)
    if reader is None:
        raise UiError(409, "Logs unavailable", "This server reads no backend's logs.")
    settings = request.app.state.settings
    release = request.app.state.log_followers.acquire(settings.max_log_followers)
    resume = request.headers.get("last-event-id") or None
    number, inner = None, None
    if resume and "." in resume and resume.split(".", 1)[0].isdigit():
        number, inner = int(resume.split(".", 1)[0]), resume.split(".", 1)[1] or None
    source = follow_logs(db, reader, stream_auth(request, session), job_id, number, _rank(rank), inner,
                         poll_s=settings.logs_poll_s, heartbeat_s=settings.logs_heartbeat_s,
                         token_grace_s=settings.job_token_grace_s)

    async def html() -> Any:
        async for message in source:
            if message.startswith(":"):
                yield message
                continue
            kind, data, ident = _log_html(message)
            if kind == "line":
                yield sse_message("html", {"target": "job-logs", "swap": "append",
                                           "html": fragment_text("_log_line.html", line=data)}, ident)
            elif kind == "end":
                attempt = data.get("attempt")
                text = f"End of attempt {attempt}'s output." if attempt else "The job ended before it printed anything."
                yield sse_message("html", {"target": "job-logs-state", "swap": "inner",
                                           "html": fragment_text("_log_state.html", text=text)})
                yield sse_message("end", {}, ident)
            elif kind == "error":
                error = data.get("error", {})
                text = ("Signed out: reload the page to sign in again." if error.get("code") == "unauthorized"
                        else error.get("message", "the log stream ended"))
                yield sse_message("html", {"target": "job-logs-state", "swap": "inner",
                                           "html": fragment_text("_log_state.html", text=text)})
                yield sse_message("end", {})

    return EventStreamResponse(html(), release)


def _back(job_id: int) -> RedirectResponse:
    return RedirectResponse(f"/ui/jobs/{job_id}", status_code=303)


@router.post("/ui/jobs/{job_id}/cancel")
def cancel(job_id: JobId, session: Csrf, db: Db) -> Response:
    with db.begin() as tx:
        cancel_job(tx, session.principal, job_id)
    return _back(job_id)


@router.post("/ui/jobs/{job_id}/resubmit")
def resubmit(job_id: JobId, request: Request, session: Csrf, db: Db) -> Response:
    """A new job from this job's stored spec (its secrets included: they never reach the page)."""
    if session.principal.role not in (Role.ADMIN, Role.MEMBER):
        raise UiError(403, "Not allowed", "Only admins and team members submit jobs.")
    with db.begin() as tx:
        spec = visible_job(tx, session.principal, job_id, detail=True).spec
    app = request.app.state
    try:
        new_id, _ = submit(db, session.principal, spec, None, app.configured_backends, app.planner,
                           local_gpus=app.settings.local_gpus)
    except ApiError as exc:
        raise UiError(exc.status, "Resubmit refused", exc.message) from exc
    return RedirectResponse(f"/ui/jobs/{new_id}", status_code=303)


@router.post("/ui/jobs/{job_id}/priority")
def change_priority(job_id: JobId, session: Csrf, admin: SignedAdmin, db: Db,
                    priority: Annotated[str, Form(max_length=8)] = "") -> Response:
    """Admins only: a member's request is a 403 page (`SignedAdmin`)."""
    try:
        value = int(priority)
    except ValueError:
        value = None
    if value is None or not -1000 <= value <= 1000:
        raise UiError(422, "Invalid priority", f"priority: {priority!r} is not a whole number from -1000 to 1000;"
                      " enter one in that range")
    try:
        with db.begin() as tx:
            set_priority(tx, session.principal, job_id, value)
    except Conflict as exc:
        raise UiError(409, "Priority unchanged", str(exc)) from exc
    return _back(job_id)

