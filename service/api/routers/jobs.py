from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Annotated

from fastapi import APIRouter, Header, Path, Query, Request, Response
from fastapi.responses import StreamingResponse

from service.api.deps import Caller, Db, Person, Reporter
from service.api.schemas import ErrorResponse, EventOut, JobOut, JobPage, MeasurementIn, MeasurementOut
from service.api.submission import submit
from service.api.views import event_out, job_out, job_summary
from service.backend_options import BackendKind
from service.names import Label
from service.spec import TrainingSpec
from service.store.jobs import (
    MAX_PAGE,
    JobFilter,
    add_measurement,
    cancel_job,
    is_terminal,
    list_events,
    list_jobs,
    visible_job,
)
from service.store.vocab import JobStatus

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
ERRORS: dict[int | str, dict[str, object]] = {
    404: {"model": ErrorResponse}, 409: {"model": ErrorResponse}, 422: {"model": ErrorResponse}}
JobId = Annotated[int, Path(ge=1, le=2**63 - 1, description="The job's id.")]


@router.post("", response_model=JobOut, status_code=201, responses=ERRORS,
             summary="Plan and queue a job")
def create_job(spec: TrainingSpec, principal: Person, db: Db, request: Request, response: Response,
               idempotency_key: Annotated[str | None, Header()] = None) -> JobOut:
    """201 with the new job; 200 with the first job when the same `Idempotency-Key` and body come
    again; 409 when the key comes with a different body; 422 when no layout fits."""
    job_id, created = submit(db, principal, spec, idempotency_key, request.app.state.configured_backends)
    with db.begin() as session:
        out = job_out(session, visible_job(session, principal, job_id, detail=True))
    if created:
        request.app.state.metrics.submissions.labels(team=out.team).inc()
    else:
        response.status_code = 200
    return out


@router.get("", response_model=JobPage, summary="List jobs, newest first")
def get_jobs(principal: Caller, db: Db,
             status: Annotated[list[JobStatus] | None, Query(description="Repeat to match several.")] = None,
             team: Annotated[Label | None, Query()] = None,
             backend: Annotated[BackendKind | None, Query()] = None,
             name: Annotated[str | None, Query(max_length=200)] = None,
             limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
             cursor: Annotated[str | None, Query(pattern=r"^\d{1,18}$")] = None) -> JobPage:
    filters = JobFilter(status=list(status or []), team=team, backend=backend, name=name)
    with db.begin() as session:
        rows, next_cursor = list_jobs(session, principal, filters, limit=limit,
                                      cursor=int(cursor) if cursor else None)
        return JobPage(items=[job_summary(j) for j in rows],
                       next_cursor=str(next_cursor) if next_cursor is not None else None)


@router.get("/{job_id}", response_model=JobOut, responses=ERRORS)
def get_job(job_id: JobId, principal: Caller, db: Db) -> JobOut:
    with db.begin() as session:
        return job_out(session, visible_job(session, principal, job_id, detail=True))


@router.post("/{job_id}/cancel", response_model=JobOut, responses=ERRORS)
def cancel(job_id: JobId, principal: Person, db: Db) -> JobOut:
    """Idempotent. A queued job is cancelled at once; a submitted one moves to CANCELLING and the
    dispatcher finishes it on the backend."""
    with db.begin() as session:
        job = cancel_job(session, principal, job_id)
        return job_out(session, job)


@router.get("/{job_id}/events", response_model=list[EventOut], responses=ERRORS,
            summary="The event history; `Accept: text/event-stream` (or ?stream=true) follows it live")
def get_events(job_id: JobId, principal: Caller, db: Db, request: Request,
               after: Annotated[int, Query(ge=0, le=2**63 - 1, description="Only events with a larger id.")] = 0,
               stream: bool = False, last_event_id: Annotated[str | None, Header()] = None) -> object:
    with db.begin() as session:
        job = visible_job(session, principal, job_id)
        if not (stream or "text/event-stream" in request.headers.get("accept", "")):
            return [event_out(e) for e in list_events(session, job, after=after)]
    start = int(last_event_id) if last_event_id and last_event_id.isdigit() else after
    poll = request.app.state.settings.events_poll_s
    return StreamingResponse(_event_stream(db, principal, job_id, start, poll), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _event_stream(db: Db, principal: Caller, job_id: int, after: int, poll_s: float) -> Iterator[str]:
    """Server-sent events until the job is terminal and every event has been sent."""
    last_beat = time.monotonic()
    while True:
        with db.begin() as session:
            job = visible_job(session, principal, job_id)
            events = [event_out(e) for e in list_events(session, job, after=after)]
            done = is_terminal(job)
        for event in events:
            after = event.id
            yield f"id: {event.id}\nevent: {event.kind}\ndata: {json.dumps(event.model_dump(mode='json'))}\n\n"
        if done and not events:
            yield "event: end\ndata: {}\n\n"
            return
        if time.monotonic() - last_beat > 15:
            last_beat = time.monotonic()
            yield ": keep-alive\n\n"
        if not events:
            time.sleep(poll_s)


@router.post("/{job_id}/measurements", response_model=MeasurementOut, status_code=201, responses=ERRORS,
             summary="Report a heartbeat, the final report or a profile summary (job token or admin)")
def report(job_id: JobId, body: MeasurementIn, principal: Reporter, db: Db) -> MeasurementOut:
    with db.begin() as session:
        job = visible_job(session, principal, job_id)
        row = add_measurement(session, principal, job, body.kind, body.data)
        return MeasurementOut(kind=row.kind, at=row.at, data=row.data)
