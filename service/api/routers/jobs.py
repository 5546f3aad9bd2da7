from __future__ import annotations

import logging
import re
import time
from collections.abc import AsyncIterator
from typing import Annotated

import anyio
import anyio.to_thread
from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import BaseModel
from sqlalchemy import Connection
from sqlalchemy.orm import Session, sessionmaker

from service.api.deps import (
    Caller,
    Credentials,
    Db,
    Person,
    Reporter,
    Unstorable,
    as_caller,
    bearer,
    check_storable,
)
from service.api.errors import INVALID_SPEC, ApiError
from service.api.schemas import ErrorField, ErrorResponse, EventOut, JobOut, JobPage, MeasurementIn, MeasurementOut
from service.api.sse import KEEP_ALIVE, sse_message, stream_error
from service.api.stream_auth import StreamAuth, as_stream_auth, for_stream
from service.api.streams import EVENT_ID, EVENT_STREAM, HEARTBEAT_S, EventStreamResponse
from service.api.submission import MAX_KEY, submit_job
from service.api.views import detail_out, encoded, event_out, job_out, job_page
from service.backend_options import BackendKind
from service.names import Label
from service.spec import TrainingSpec
from service.store.db import one_statement
from service.store.job_sort import BadCursor, JobCursor, JobSort, SortText
from service.store.jobs import (
    MAX_PAGE,
    JobFilter,
    add_heartbeat,
    add_measurement,
    cancel_job,
    is_terminal,
    job_detail,
    list_events,
    list_job_rows,
    visible_job,
)
from service.store.models import utcnow
from service.store.tokens import DEFAULT_JOB_TOKEN_GRACE_S, NotFound, Principal
from service.store.vocab import JobStatus, MeasurementKind

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
ERRORS: dict[int | str, dict[str, object]] = {
    404: {"model": ErrorResponse}, 409: {"model": ErrorResponse}, 422: {"model": ErrorResponse}}
JobId = Annotated[int, Path(ge=1, le=2**63 - 1, description="The job's id.")]
#: The job list's defaults and bounds (`get_jobs`).
DEFAULT_LIMIT = 50
DEFAULT_SORT_TEXT: SortText = "-submitted"
MAX_NAME = 200
CURSOR = re.compile(r"[A-Za-z0-9_-]{1,600}")


def rendered(model: BaseModel, status_code: int = 200) -> JSONResponse:
    """`model` as the response, rendered now. Called inside the transaction that wrote it: a value no
    response can carry raises here and the write rolls back, instead of committing a row that every
    later read of the job fails on."""
    try:
        return JSONResponse(model.model_dump(mode="json"), status_code=status_code)
    except (ValueError, RecursionError) as exc:  # UnicodeEncodeError, NaN, pydantic's serialisation errors
        raise ApiError(422, "validation_error", "the request holds a value that cannot be stored and read back"
                       f" ({type(exc).__name__}); send finite numbers and valid Unicode") from exc


def storable(value: object, *, code: str = "validation_error") -> None:
    """422 naming the field when `value` cannot be stored on both databases (see `check_storable`)."""
    try:
        check_storable(value)
    except Unstorable as exc:
        what = "spec" if code == INVALID_SPEC else "request"
        raise ApiError(422, code, f"invalid {what}: {exc.loc}: {exc.message}",
                       fields=[ErrorField(loc=exc.loc, message=exc.message)]) from exc


@router.post("", response_model=JobOut, status_code=201,
             responses={**ERRORS, 200: {"model": JobOut, "description": "The job an earlier request with the"
                                        " same Idempotency-Key and body created."},
                        503: {"model": ErrorResponse}},
             summary="Plan and queue a job")
def create_job(spec: TrainingSpec, principal: Person, request: Request,
               idempotency_key: Annotated[str | None, Header(min_length=1, max_length=MAX_KEY)] = None) -> Response:
    """201 with the new job; 200 with the first job when the same `Idempotency-Key` and body come
    again; 409 when the key comes with a different body; 422 when no layout fits or the key is empty
    or longer than the document says. Planned and queued by `submit_job`, whose refusals pass through
    to the app's exception handlers; a created job counts in the submissions metric. Nothing after
    the commit can raise a refusal."""
    state = request.app.state
    submitted = submit_job(state.sessions, principal, spec, idempotency_key, state.configured_backends,
                           state.planner, local_gpus=state.settings.local_gpus)
    if submitted.created:
        state.metrics.submissions.labels(team=submitted.team).inc()
    return Response(submitted.body, status_code=201 if submitted.created else 200, media_type="application/json")


@router.get("", response_model=JobPage, responses={422: {"model": ErrorResponse}},
            summary="List jobs, newest first or in another order")
async def get_jobs(credentials: Credentials, request: Request,
                   status: Annotated[list[JobStatus] | None, Query(description="Repeat to match several.")] = None,
                   team: Annotated[Label | None, Query()] = None,
                   backend: Annotated[BackendKind | None, Query()] = None,
                   name: Annotated[str | None, Query(max_length=MAX_NAME)] = None,
                   limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = DEFAULT_LIMIT,
                   sort: Annotated[SortText, Query(description="The order: a column, descending with a leading"
                                                   " `-`; ties go by job id in the same direction.")]
                   = DEFAULT_SORT_TEXT,
                   cursor: Annotated[str | None, Query(pattern=f"^{CURSOR.pattern}$",
                                                       description="`next_cursor` of the previous page, with the"
                                                       " same `sort`.")] = None) -> Response:
    """The page of jobs the query asks for, of those the caller may see (`list_job_rows`), encoded
    directly: a `JobPage`, which FastAPI would otherwise validate again."""
    filters = JobFilter(status=list(status or []), team=team, backend=backend, name=name)
    order = JobSort.parse(sort)
    try:
        after = JobCursor.decode(cursor, order) if cursor else None
    except BadCursor as exc:
        raise ApiError(422, "validation_error", f"cursor: {exc}",
                       fields=[ErrorField(loc="query.cursor", message=str(exc))]) from exc

    def page(conn: Connection, principal: Principal) -> Response:
        rows, next_cursor = list_job_rows(conn, principal, filters, limit=limit, cursor=after, sort=order)
        answer = job_page(rows, next_cursor.encode() if next_cursor is not None else None)
        return Response(encoded(answer), media_type="application/json")

    return await as_caller(request, credentials, page)


@router.get("/{job_id}", response_model=JobOut, responses=ERRORS)
async def get_job(job_id: JobId, credentials: Credentials, request: Request) -> Response:
    """Job `job_id` as the caller may see it (404 otherwise): Core reads outside a transaction
    (`job_detail`), rendered by pydantic's serializer. The answer is a `JobOut` already, which FastAPI
    would otherwise validate again through `response_model`."""
    return await as_caller(request, credentials, lambda conn, principal: Response(
        encoded(detail_out(job_detail(conn, principal, job_id))), media_type="application/json"))


@router.post("/{job_id}/cancel", response_model=JobOut, responses=ERRORS)
def cancel(job_id: JobId, principal: Person, db: Db) -> Response:
    """Idempotent. A queued job is cancelled at once; a submitted one moves to CANCELLING and the
    dispatcher finishes it on the backend."""
    with db.begin() as session:
        job = cancel_job(session, principal, job_id)
        return rendered(job_out(session, job))


def _poll(db: sessionmaker[Session], auth: StreamAuth, job_id: int, after: int) -> tuple[list[EventOut], bool] | str:
    """One poll, in one transaction: the caller again (a revoked or expired token ends the stream), the
    job (still visible to it), the events after `after`. A string names why the stream must end."""
    with db.begin() as session:
        principal = auth(session)
        if principal is None:
            return "unauthorized"
        try:
            job = visible_job(session, principal, job_id)
        except NotFound:
            return "not_found"
        return [event_out(e) for e in list_events(session, job, after=after)], is_terminal(job)


async def event_stream(db: sessionmaker[Session], auth: StreamAuth | str, job_id: int, after: int,
                       poll_s: float, token_grace_s: float = DEFAULT_JOB_TOKEN_GRACE_S) -> AsyncIterator[str]:
    """Server-sent events until the job is terminal and every event has been sent (`auth`: who it acts
    for, `service.api.stream_auth`; a string is a bearer secret). Runs on the event loop: it sleeps
    there, and each poll borrows a worker thread only for its database reads."""
    check = as_stream_auth(auth, token_grace_s)
    last_beat = time.monotonic()
    while True:
        try:
            polled = await anyio.to_thread.run_sync(_poll, db, check, job_id, after)
        except Exception:  # the database went away: say so, rather than cut the stream mid-message
            log.exception("event stream of job %s: poll failed", job_id)
            yield stream_error("unavailable")
            return
        if isinstance(polled, str):
            yield stream_error(polled, f"no job {job_id}" if polled == "not_found" else None)
            return
        events, done = polled
        for event in events:
            after = event.id
            yield sse_message(event.kind, event.model_dump(mode="json"), event.id)
        if done and not events:
            yield sse_message("end", {})
            return
        if time.monotonic() - last_beat > HEARTBEAT_S:
            last_beat = time.monotonic()
            yield KEEP_ALIVE
        if not events:
            await anyio.sleep(poll_s)


EVENT_RESPONSES: dict[int | str, dict[str, object]] = {
    **ERRORS,
    200: {"description": "The events as JSON, or with `Accept: text/event-stream` (or ?stream=true) a live"
          " stream: one `id:`/`event: <kind>`/`data: <EventOut JSON>` message per event, `: keep-alive`"
          " comments, and a last `event: end` when the job is terminal (`event: error` when the token stops"
          " working).",
          "content": {EVENT_STREAM: {"schema": {"type": "string"}}}},
    400: {"model": ErrorResponse, "description": "Last-Event-ID is not an event id."},
    429: {"model": ErrorResponse, "description": "Too many live streams for this token or this server."},
}


@router.get("/{job_id}/events", response_model=list[EventOut], responses=EVENT_RESPONSES,
            summary="The event history; `Accept: text/event-stream` (or ?stream=true) follows it live")
def get_events(job_id: JobId, principal: Caller, db: Db, request: Request,
               credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
               after: Annotated[int, Query(ge=0, le=2**63 - 1, description="Only events with a larger id.")] = 0,
               stream: bool = False,
               last_event_id: Annotated[str, Header(
                   description="Resume a stream after this event id (what the stream sent as `id:`).",
                   json_schema_extra={"pattern": f"^{EVENT_ID.pattern}$"})] = "") -> object:
    if last_event_id and EVENT_ID.fullmatch(last_event_id) is None:  # empty: none, as EventSource means it
        raise ApiError(400, "bad_request", "Last-Event-ID must be an event id: 1 to 18 digits")
    with db.begin() as session:
        job = visible_job(session, principal, job_id)
        if not (stream or EVENT_STREAM in request.headers.get("accept", "")):
            return [event_out(e) for e in list_events(session, job, after=after)]
    limits = request.app.state.settings
    auth = for_stream(principal, credentials, limits.job_token_grace_s)
    release = request.app.state.streams.acquire(principal.token_id, total=limits.max_streams,
                                                per_token=limits.max_streams_per_token)
    start = int(last_event_id) if last_event_id else after
    poll_s = request.app.state.settings.events_poll_s
    grace = request.app.state.settings.job_token_grace_s
    return EventStreamResponse(event_stream(db, auth, job_id, start, poll_s, grace), release)


@router.post("/{job_id}/measurements", response_model=MeasurementOut, status_code=201, responses=ERRORS,
             summary="Report a heartbeat, the final report or a profile summary (job token or admin)")
def report(job_id: JobId, body: MeasurementIn, principal: Reporter, db: Db, request: Request) -> Response:
    """`data` reaches here as the request gate checked it (storable JSON): pydantic passes `Any` through.
    A heartbeat is one insert (`add_heartbeat`); the final report and a profile also write an event."""
    if body.kind == MeasurementKind.HEARTBEAT:
        at = utcnow()
        answer = rendered(MeasurementOut(kind=MeasurementKind.HEARTBEAT, at=at, data=body.data), 201)
        # Rendered first: an answer that cannot be sent (`ApiError`) stores nothing.
        with one_statement(request.app.state.engine) as conn:
            add_heartbeat(conn, principal, job_id, body.data, at=at)
        return answer
    with db.begin() as session:
        job = visible_job(session, principal, job_id)
        row = add_measurement(session, principal, job, body.kind, body.data)
        return rendered(MeasurementOut(kind=row.kind, at=row.at, data=row.data), 201)

