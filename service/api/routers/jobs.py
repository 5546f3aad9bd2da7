from __future__ import annotations

import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Annotated, Any

import anyio
import anyio.to_thread
from fastapi import APIRouter, Depends, FastAPI, Header, Path, Query, Request, Response
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import BaseModel, TypeAdapter, ValidationError
from sqlalchemy import Connection
from sqlalchemy.orm import Session, sessionmaker
from starlette.datastructures import QueryParams

from service.api.deps import (
    Caller,
    Db,
    Person,
    Reporter,
    Unstorable,
    bearer,
    check_storable,
    connection_principal,
)
from service.api.errors import INVALID_SPEC, ApiError
from service.api.schemas import ErrorField, ErrorResponse, EventOut, JobOut, JobPage, MeasurementIn, MeasurementOut
from service.api.shortcuts import ShortcutRequest, ShortcutTaken, ShortcutThreads
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
from service.store.known_tokens import KnownTokens, LiveValues, Unproven, live_values
from service.store.models import utcnow
from service.store.tokens import DEFAULT_JOB_TOKEN_GRACE_S, NotFound, Principal
from service.store.vocab import JobStatus, MeasurementKind, Role

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
ERRORS: dict[int | str, dict[str, object]] = {
    404: {"model": ErrorResponse}, 409: {"model": ErrorResponse}, 422: {"model": ErrorResponse}}
JobId = Annotated[int, Path(ge=1, le=2**63 - 1, description="The job's id.")]
#: The job list's defaults and bounds (`get_jobs`, and its shortcut's reading of a query).
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
    or longer than the document says (the shortcut's 400 for it goes to this route). Answered by the
    request gate's `create_job_shortcut` for a bearer token it finds valid and a spec it submits."""
    return submission_answer(request.app, principal, spec, idempotency_key)


def submission_answer(api: FastAPI, principal: Principal, spec: TrainingSpec, idempotency_key: str | None,
                      live: LiveValues | None = None) -> Response:
    """Plan and queue `spec` on the app's sessions and planner (`submit_job`, whose refusals pass
    through, for the app's exception handlers, and which reads `live`), count a created job in the
    submissions metric, and answer with the job: 201 created, or 200 for an `Idempotency-Key` replay.
    Nothing after the commit can raise a refusal."""
    state = api.state
    submitted = submit_job(state.sessions, principal, spec, idempotency_key, state.configured_backends,
                           state.planner, local_gpus=state.settings.local_gpus, live=live)
    if submitted.created:
        state.metrics.submissions.labels(team=submitted.team).inc()
    return Response(submitted.body, status_code=201 if submitted.created else 200, media_type="application/json")


async def create_job_shortcut(api: FastAPI, request: ShortcutRequest) -> ShortcutTaken | None:
    """`create_job` as the request gate's shortcut (`service.api.app.SHORTCUTS`): the token check and
    the submission in one thread hop, where the route takes two (the gate's token check, then the
    route), without FastAPI's routing and dependency solving, for submissions per second.

    It submits only a body `TrainingSpec` takes and a team member's or admin's token, and answers only
    what `submission_answer` returns (201, or 200 for a replay). It declines anything else, and a
    submission that `submit_job` refuses (400, 403, 409, 422, 503, a concurrent change): nothing was
    committed, and the route submits again and answers through the app's exception handlers. A job
    token's submission goes to the route's 403."""
    try:
        spec = TrainingSpec.model_validate(request.body)
    except ValidationError:  # the route's 422, formatted by its handler
        return None
    idempotency_key = request.headers.get("idempotency-key")
    return await _threads(api).run_submission(_submit_with_token, api, request.secret, spec, idempotency_key)


def _submit_with_token(api: FastAPI, secret: str, spec: TrainingSpec, idempotency_key: str | None
                       ) -> ShortcutTaken | None:
    """The submission shortcut's thread hop. A token this process has authenticated before
    (`KnownTokens`), submitting without an `Idempotency-Key`, is checked by the transaction's read of
    the team: one statement fewer than a lookup first. A refusal (which may come before that read, as
    the planner's does) declines as if the token had not been looked up (None: the gate checks it,
    then the route answers). Otherwise, or when the read proves nothing (`Unproven`: nothing stored),
    the token is looked up first on a connection of its own."""
    remembered = _remembered(api, secret) if idempotency_key is None else None
    if remembered is not None and remembered[0].role != Role.JOB:
        known, live = remembered
        try:
            return known, submission_answer(api, known, spec, None, live)
        except Unproven:
            pass
        except Exception as exc:
            if not _handled(api, exc):
                raise
            return None
    with one_statement(api.state.engine) as conn:  # given back before the submission takes its own
        principal = _looked_up(api, conn, secret)
    if principal is None:
        return None, None
    if principal.role == Role.JOB:
        return principal, None
    try:
        return principal, submission_answer(api, principal, spec, idempotency_key)
    except Exception as exc:
        if not _handled(api, exc):
            raise
        return principal, None


def _threads(api: FastAPI) -> ShortcutThreads:
    """Where the shortcuts take their turn to work (`ShortcutThreads`, `Settings.shortcut_threads`)."""
    threads: ShortcutThreads = api.state.shortcut_threads
    return threads


def _handled(api: FastAPI, exc: Exception) -> bool:
    """Whether the app answers `exc` through one of its exception handlers (`errors.install`): a
    refusal the route would render, which a shortcut leaves to the route."""
    return any(isinstance(kind, type) and isinstance(exc, kind) for kind in api.exception_handlers)


@router.get("", response_model=JobPage, responses={422: {"model": ErrorResponse}},
            summary="List jobs, newest first or in another order")
def get_jobs(principal: Caller, request: Request,
             status: Annotated[list[JobStatus] | None, Query(description="Repeat to match several.")] = None,
             team: Annotated[Label | None, Query()] = None,
             backend: Annotated[BackendKind | None, Query()] = None,
             name: Annotated[str | None, Query(max_length=MAX_NAME)] = None,
             limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = DEFAULT_LIMIT,
             sort: Annotated[SortText, Query(description="The order: a column, descending with a leading `-`;"
                                             " ties go by job id in the same direction.")] = DEFAULT_SORT_TEXT,
             cursor: Annotated[str | None, Query(pattern=f"^{CURSOR.pattern}$",
                                                 description="`next_cursor` of the previous page, with the"
                                                 " same `sort`.")] = None) -> Response:
    """Answered by the request gate's `jobs_shortcut` for a bearer token it finds valid and a query it
    reads plainly: this route answers the rest the same way."""
    filters = JobFilter(status=list(status or []), team=team, backend=backend, name=name)
    order = JobSort.parse(sort)
    try:
        after = JobCursor.decode(cursor, order) if cursor else None
    except BadCursor as exc:
        raise ApiError(422, "validation_error", f"cursor: {exc}",
                       fields=[ErrorField(loc="query.cursor", message=str(exc))]) from exc
    with one_statement(request.app.state.engine) as conn:  # no ORM session, no BEGIN and COMMIT around it
        return page_answer(conn, principal, ListQuery(filters, limit, order, after))


@dataclass(frozen=True, slots=True)
class ListQuery:
    """A page of the job list as asked for: filters, page size, order and where the page starts."""

    filters: JobFilter
    limit: int
    order: JobSort
    after: JobCursor | None


def page_answer(conn: Connection, principal: Principal, query: ListQuery, live: LiveValues | None = None
                ) -> Response:
    """The page of jobs `query` asks for, of those `principal` may see (`list_job_rows`, which reads
    `live`), encoded directly: a `JobPage`, which FastAPI would otherwise validate again."""
    rows, next_cursor = list_job_rows(conn, principal, query.filters, limit=query.limit, cursor=query.after,
                                      sort=query.order, live=live)
    page = job_page(rows, next_cursor.encode() if next_cursor is not None else None)
    return Response(encoded(page), media_type="application/json")


_LABEL: TypeAdapter[str] = TypeAdapter(Label)
_SORT: TypeAdapter[str] = TypeAdapter(SortText)
_LIMIT = re.compile(r"[1-9][0-9]{0,5}")
_SCALARS = frozenset({"team", "backend", "name", "limit", "sort", "cursor"})
_STATUSES = frozenset(status.value for status in JobStatus)


def plain_list_query(query_string: bytes) -> ListQuery | None:
    """The list query `query_string` asks for when every parameter is one `get_jobs` takes, written
    plainly (`status` repeated, each other parameter once, a limit without sign or leading zero), and
    valid as the route would find it; else None, and the route reads it (and answers any 422)."""
    statuses: list[JobStatus] = []
    given: dict[str, str] = {}
    for key, value in QueryParams(query_string).multi_items():
        if key == "status" and value in _STATUSES:
            statuses.append(JobStatus(value))
        elif key in _SCALARS and key not in given:
            given[key] = value
        else:
            return None
    try:
        team = _LABEL.validate_python(given["team"]) if "team" in given else None
        backend = BackendKind(given["backend"]) if "backend" in given else None
        order = JobSort.parse(_SORT.validate_python(given.get("sort", DEFAULT_SORT_TEXT)))
    except ValueError:  # pydantic's ValidationError is one
        return None
    name, limit, cursor = given.get("name"), given.get("limit", str(DEFAULT_LIMIT)), given.get("cursor")
    if (name is not None and len(name) > MAX_NAME) or _LIMIT.fullmatch(limit) is None or int(limit) > MAX_PAGE \
            or (cursor is not None and CURSOR.fullmatch(cursor) is None):
        return None
    try:
        after = JobCursor.decode(cursor, order) if cursor else None
    except BadCursor:
        return None
    return ListQuery(JobFilter(status=statuses, team=team, backend=backend, name=name), int(limit), order, after)


async def jobs_shortcut(api: FastAPI, request: ShortcutRequest) -> ShortcutTaken | None:
    """`get_jobs` as the request gate's shortcut (`service.api.app.SHORTCUTS`): the token check and the
    page's read on one connection in one thread hop, where the route takes two of each, and the query
    read by `plain_list_query` instead of FastAPI's parameter solving. A query it does not read plainly
    is left to the route."""
    query = plain_list_query(request.query)
    if query is None:
        return None
    return await _threads(api).run(_with_token, api, request.secret,
                                   lambda conn, principal, live: page_answer(conn, principal, query, live))


Work = Callable[[Connection, Principal, LiveValues | None], Response | None]
"""A shortcut's work on one connection: its answer for the principal, or None to decline. With the
values of `TOKEN_LIVE` (not None), its statement checks the token too: `Unproven` when it returns no
row, and `NotFound` only once a row has come back."""


def _with_token(api: FastAPI, secret: str, work: Work) -> ShortcutTaken:
    """What the read and heartbeat shortcuts do in their thread hop. For a token this process has
    authenticated before (`KnownTokens`), `work` checks it in its own statement: one statement fewer
    than a lookup first. Otherwise, or when that statement proves nothing (`Unproven`, or a decline or
    an `ApiError` that may come before it), `_authenticated` on the same connection."""
    remembered = _remembered(api, secret)
    with one_statement(api.state.engine) as conn:
        if remembered is not None:
            principal, live = remembered
            try:
                answer = work(conn, principal, live)
            except (Unproven, ApiError):
                answer = None
            except NotFound:  # a row came back: the token works
                return principal, None
            if answer is not None:
                return principal, answer
        return _authenticated(api, conn, secret, lambda conn, principal: work(conn, principal, None))


def _authenticated(api: FastAPI, conn: Connection, secret: str,
                   work: Callable[[Connection, Principal], Response | None]) -> ShortcutTaken:
    """The token check (`_looked_up`), then `work` with the principal on the same connection. `work`
    declines with None, `NotFound` (the route's 404) or `ApiError` (a 422), having stored nothing."""
    principal = _looked_up(api, conn, secret)
    if principal is None:
        return None, None
    try:
        return principal, work(conn, principal)
    except (NotFound, ApiError):
        return principal, None


def _remembered(api: FastAPI, secret: str) -> tuple[Principal, LiveValues] | None:
    """The principal `KnownTokens` holds for `secret`, with the values of `TOKEN_LIVE` at this moment
    for the statement that checks it; None for a token this process has not authenticated."""
    principal = api.state.known_tokens.principal(secret)
    if principal is None:
        return None
    return principal, live_values(principal, utcnow(), api.state.settings.job_token_grace_s)


def _looked_up(api: FastAPI, conn: Connection, secret: str) -> Principal | None:
    """The token looked up on `conn` (`authenticate`): remembered in `KnownTokens` when it works,
    forgotten when it does not."""
    known: KnownTokens = api.state.known_tokens
    principal = connection_principal(conn, secret, api.state.settings)
    if principal is None:
        known.forget(secret)
    else:
        known.remember(secret, principal)
    return principal


#: A job id in a path as the shortcuts take it; `JobId` is the routes' own check.
_SHORTCUT_JOB_ID = re.compile(r"[1-9][0-9]{0,18}")


def _shortcut_job_id(path_params: dict[str, str]) -> int | None:
    """The path's job id if it is plainly one `JobId` takes (no sign, no leading zero), else None."""
    job_id = path_params.get("job_id", "")
    if _SHORTCUT_JOB_ID.fullmatch(job_id) is None or int(job_id) > 2**63 - 1:
        return None
    return int(job_id)


@router.get("/{job_id}", response_model=JobOut, responses=ERRORS)
def get_job(job_id: JobId, principal: Caller, request: Request) -> Response:
    """Answered by the request gate's `job_shortcut` for a bearer token it finds valid, on a job that
    token may see: this route answers the rest the same way."""
    with one_statement(request.app.state.engine) as conn:
        return job_answer(conn, principal, job_id)


def job_answer(conn: Connection, principal: Principal, job_id: int, live: LiveValues | None = None
               ) -> Response:
    """Job `job_id` as `principal` may see it (`NotFound` otherwise): Core reads outside a transaction
    (`job_detail`, which reads `live`), rendered by pydantic's serializer. The answer is a `JobOut`
    already, which FastAPI would otherwise validate again through `response_model`."""
    return Response(encoded(detail_out(job_detail(conn, principal, job_id, live))), media_type="application/json")


async def job_shortcut(api: FastAPI, request: ShortcutRequest) -> ShortcutTaken | None:
    """`get_job` as the request gate's shortcut (`service.api.app.SHORTCUTS`): the token check and the
    reads on one connection in one thread hop, where the route takes two of each. A job id that is not
    plainly one (`_shortcut_job_id`), or a job the token may not see, is left to the route (its answer,
    a 422 or a 404 among them)."""
    job_id = _shortcut_job_id(request.path_params)
    if job_id is None:
        return None
    return await _threads(api).run(_with_token, api, request.secret,
                                   lambda conn, principal, live: job_answer(conn, principal, job_id, live))


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


def heartbeat_answer(conn: Connection, principal: Principal, job_id: int, data: dict[str, Any],
                     live: LiveValues | None = None) -> JSONResponse:
    """Store a heartbeat of job `job_id` on `conn` (`add_heartbeat`: `NotFound` for a job `principal`
    may not see; it reads `live`) and return the 201 answer. The answer is rendered before the insert,
    which commits by itself (`one_statement`): an answer that cannot be sent (`ApiError`) stores
    nothing, as `rendered` inside a transaction guarantees for the other kinds."""
    at = utcnow()
    answer = rendered(MeasurementOut(kind=MeasurementKind.HEARTBEAT, at=at, data=data), 201)
    add_heartbeat(conn, principal, job_id, data, at=at, live=live)
    return answer


async def heartbeat_shortcut(api: FastAPI, request: ShortcutRequest) -> ShortcutTaken | None:
    """`report` for a heartbeat, as the request gate's shortcut (`service.api.app.SHORTCUTS`): every
    running job sends one every few seconds. One thread hop and one connection check the
    token and store the heartbeat, where the route takes two of each (the gate's token check, then the
    route), and FastAPI's routing, dependency solving and second parse of the body are skipped.

    It answers only what `report` would answer the same way: a job id `JobId` takes, a body that
    `MeasurementIn` takes as a heartbeat, a job or admin token, a job that token may see. It declines
    anything else, having stored nothing, and the route answers as it always does (401, 403, 404, 422)."""
    job_id = _shortcut_job_id(request.path_params)
    if job_id is None:
        return None
    try:
        measured = MeasurementIn.model_validate(request.body)
    except ValidationError:
        return None
    if measured.kind != MeasurementKind.HEARTBEAT:
        return None

    def store(conn: Connection, principal: Principal, live: LiveValues | None) -> Response | None:
        if principal.role == Role.MEMBER:  # the route's 403
            return None
        return heartbeat_answer(conn, principal, job_id, measured.data, live)

    return await _threads(api).run(_with_token, api, request.secret, store)


@router.post("/{job_id}/measurements", response_model=MeasurementOut, status_code=201, responses=ERRORS,
             summary="Report a heartbeat, the final report or a profile summary (job token or admin)")
def report(job_id: JobId, body: MeasurementIn, principal: Reporter, db: Db, request: Request) -> Response:
    """`data` reaches here as the request gate checked it (storable JSON): pydantic passes `Any` through.
    A heartbeat is one insert (`add_heartbeat`); the final report and a profile also write an event."""
    if body.kind == MeasurementKind.HEARTBEAT:
        with one_statement(request.app.state.engine) as conn:
            return heartbeat_answer(conn, principal, job_id, body.data)
    with db.begin() as session:
        job = visible_job(session, principal, job_id)
        row = add_measurement(session, principal, job, body.kind, body.data)
        return rendered(MeasurementOut(kind=row.kind, at=row.at, data=row.data), 201)

