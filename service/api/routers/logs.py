"""A job's logs and artifacts, read from its backend on demand (`app.state.log_reader`, a
`service.api.logs_source.LogReader`); nothing is copied into the database.

`GET /v1/jobs/{id}/logs?rank=&attempt=&cursor=&limit=`: NDJSON (`application/x-ndjson`), one
`{"rank", "stream", "line", "cursor"}` object per line, then one last `{"next_cursor", "finished",
"attempt"}` object (the next cursor is also the `Shardctl-Next-Cursor` header). `follow=true`: Server-Sent
Events, one `event: line` per line whose `id:` is the cursor after it (an `EventSource` resumes with
`Last-Event-ID`), `: keep-alive` comments while nothing is new, and a last `event: end` once the
attempt has ended and everything it printed was sent (`event: error` when the token stops working or
the backend fails). A cursor is `<attempt>.<backend cursor>`: resuming reads the attempt it came from.
The attempt is the latest unless `attempt` (or the cursor) names one; ranks are merged unless `rank`
is given (each line names its rank). Visibility is `GET /v1/jobs/{id}`'s: another team's job is a 404.

`GET /v1/jobs/{id}/artifacts?attempt=`: the files under the attempt's output folder (path, size,
modified time); `GET /v1/jobs/{id}/artifacts/{path}` sends one of at most `max_artifact_bytes`.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Annotated

import anyio
import anyio.to_thread
from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import BaseModel, Field
from sqlalchemy.orm import Session, sessionmaker

from service.api.deps import Caller, Db, bearer
from service.api.errors import ApiError
from service.api.logs_source import LogReader
from service.api.routers.jobs import EVENT_STREAM, EventStreamResponse, JobId
from service.api.schemas import ErrorResponse
from service.api.sse import KEEP_ALIVE, sse_message
from service.api.stream_auth import StreamAuth, as_stream_auth, for_stream
from service.joblogs import (
    MAX_CURSOR_CHARS,
    ArtifactInfo,
    ArtifactNotFound,
    ArtifactTooLarge,
    AttemptRef,
    BadArtifactPath,
    BadCursor,
    LogChunk,
    LogLine,
    OutputsError,
    OutputsUnavailable,
    decode_cursor,
)
from service.store.jobs import is_terminal, visible_job
from service.store.models import Attempt, Job
from service.store.tokens import DEFAULT_JOB_TOKEN_GRACE_S, NotFound
from service.store.vocab import AttemptStatus

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/jobs", tags=["logs"])

NDJSON = "application/x-ndjson"
CURSOR_HEADER = "Shardctl-Next-Cursor"
#: Lines one page (without follow) holds by default, and at most.
DEFAULT_LIMIT, MAX_LIMIT = 1000, 10_000
#: Lines a live stream asks the backend for at once.
FOLLOW_BATCH = 500
#: Backend reads one page may make to fill `limit` (each reads a bounded number of bytes per source).
MAX_READS = 64
_CURSOR = re.compile(r"^([0-9]{1,6})\.([A-Za-z0-9_-]*)$")
_ENDED = frozenset({AttemptStatus.SUCCEEDED, AttemptStatus.FAILED, AttemptStatus.CANCELLED, AttemptStatus.MISSING,
                    AttemptStatus.PREEMPTED})
RankQ = Annotated[int | None, Query(ge=0, le=1_000_000, description="Only this global rank's lines.")]
AttemptQ = Annotated[int | None, Query(ge=1, le=1_000_000, description="The attempt number (default: the"
                                       " latest, or the cursor's).")]


class LogLineOut(BaseModel):
    rank: int | None = Field(description="The global rank that printed it; null for the launcher's own lines.")
    stream: str = Field(description="stdout, stderr, or output (both, where the backend keeps them merged).")
    line: str
    cursor: str = Field(description="Resume here (`cursor=` or `Last-Event-ID`) to read what follows this line.")


class LogPageEnd(BaseModel):
    next_cursor: str | None = Field(description="Resume here; null while the job has no attempt yet.")
    finished: bool = Field(description="The attempt has ended and this is the end of its output.")
    attempt: int | None


class ArtifactList(BaseModel):
    job_id: int
    attempt: int | None = Field(description="The attempt whose output folder this is; null before the first.")
    artifacts: list[ArtifactInfo]


ERRORS: dict[int | str, dict[str, object]] = {
    400: {"model": ErrorResponse, "description": "A cursor (or Last-Event-ID) this server did not make."},
    404: {"model": ErrorResponse}, 409: {"model": ErrorResponse, "description": "`not_available`: the job's"
                                         " backend cannot show this here (not configured on this server, or"
                                         " no folder it can read, as on Kubernetes); `too_large`: an artifact"
                                         " over SHARDCTL_MAX_ARTIFACT_BYTES."},
    503: {"model": ErrorResponse, "description": "The backend did not answer; try again."}}


class Followers:
    """The live log streams of this process, so that followers cannot take every connection."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.open = 0

    def acquire(self, limit: int) -> Callable[[], None]:
        with self._lock:
            if self.open >= limit:
                raise ApiError(429, "too_many_requests", f"this server has its {limit} live log streams open (at"
                               f" most {limit}, SHARDCTL_MAX_LOG_FOLLOWERS); read pages without follow, or retry",
                               headers={"Retry-After": "5"})
            self.open += 1
        released = False

        def release() -> None:
            nonlocal released
            with self._lock:
                if not released:
                    released = True
                    self.open -= 1

        return release


def _reader(request: Request) -> LogReader:
    reader: LogReader | None = request.app.state.log_reader
    if reader is None:
        raise ApiError(409, "not_available", "this server reads no backend logs or artifacts (it was started"
                       " without them; `shardctl serve` wires them)")
    return reader


def _api_error(exc: OutputsError) -> ApiError:
    if isinstance(exc, OutputsUnavailable):
        if exc.retry:
            return ApiError(503, "unavailable", str(exc), headers={"Retry-After": "5"})
        return ApiError(409, "not_available", str(exc))
    if isinstance(exc, BadCursor | BadArtifactPath):
        return ApiError(400, "bad_request", str(exc))
    if isinstance(exc, ArtifactNotFound):
        return ApiError(404, "not_found", str(exc))
    if isinstance(exc, ArtifactTooLarge):
        return ApiError(409, "too_large", str(exc))
    return ApiError(503, "unavailable", str(exc))


def split_cursor(cursor: str | None) -> tuple[int | None, str | None]:
    """(attempt, backend cursor) of an API cursor; (None, None) for none. The backend cursor is decoded
    here too, so that one this server did not make is a 400 before any reading or streaming starts."""
    if not cursor:
        return None, None
    match = _CURSOR.match(cursor)
    try:
        if match is None:
            raise BadCursor("not a log cursor")
        decode_cursor(match.group(2) or None)
    except BadCursor:
        raise ApiError(400, "bad_request", "not a log cursor this server made: pass back a `cursor`,"
                       " `next_cursor` or event id as sent") from None
    return int(match.group(1)), match.group(2) or None


def join_cursor(attempt: int, inner: str) -> str:
    return f"{attempt}.{inner}"


def _pick(job: Job, number: int | None) -> Attempt | None:
    attempts = sorted(job.attempts, key=lambda a: a.number)
    if number is None:
        return attempts[-1] if attempts else None
    found = next((a for a in attempts if a.number == number), None)
    if found is None:
        raise ApiError(404, "not_found", f"job {job.id} has no attempt {number} (it has {len(attempts)})")
    return found


def _ref(job: Job, attempt: Attempt) -> AttemptRef:
    return AttemptRef(backend=str(job.backend), name=attempt.backend_name, backend_id=attempt.backend_id,
                      job_id=job.id, attempt=attempt.number)


def _ended(job: Job, attempt: Attempt) -> bool:
    return attempt.status in _ENDED or attempt.finished_at is not None or is_terminal(job)


def _line_out(attempt: int, line: LogLine) -> dict[str, object]:
    return {"rank": line.rank, "stream": line.stream, "line": line.line, "cursor": join_cursor(attempt, line.cursor)}


@router.get("/{job_id}/logs", responses={**ERRORS, 200: {
    "description": "NDJSON lines then a `next_cursor` line; with follow=true, Server-Sent Events (see the"
                   " module documentation).", "content": {NDJSON: {"schema": {"type": "string"}},
                                                          EVENT_STREAM: {"schema": {"type": "string"}}}},
    429: {"model": ErrorResponse, "description": "Too many live log streams on this server."}},
    summary="A job's output: a page of NDJSON lines, or follow it live (Server-Sent Events)")
def get_logs(job_id: JobId, principal: Caller, db: Db, request: Request,
             credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
             rank: RankQ = None, attempt: AttemptQ = None,
             cursor: Annotated[str | None, Query(max_length=MAX_CURSOR_CHARS, description="Resume after this"
                                                 " cursor.")] = None,
             follow: bool = False,
             limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="Lines in one page (not with follow).")]
             = DEFAULT_LIMIT,
             last_event_id: Annotated[str, Header(max_length=MAX_CURSOR_CHARS, description="Resume a stream"
                                                  " after this cursor (what it sent as `id:`).")] = "") -> Response:
    reader = _reader(request)
    from_attempt, inner = split_cursor(last_event_id or cursor)
    if attempt is not None and from_attempt is not None and attempt != from_attempt:
        raise ApiError(400, "bad_request", f"the cursor is of attempt {from_attempt}, not {attempt}")
    number = attempt if attempt is not None else from_attempt
    with db.begin() as session:
        job = visible_job(session, principal, job_id)
        picked = _pick(job, number)
        ref = None if picked is None else _ref(job, picked)
        ended = is_terminal(job) if picked is None else _ended(job, picked)
    if follow:
        settings = request.app.state.settings
        auth = for_stream(principal, credentials, settings.job_token_grace_s)
        release = request.app.state.log_followers.acquire(settings.max_log_followers)
        stream = follow_logs(db, reader, auth, job_id, number, rank, inner,
                             poll_s=settings.logs_poll_s, heartbeat_s=settings.logs_heartbeat_s,
                             token_grace_s=settings.job_token_grace_s)
        return EventStreamResponse(stream, release)
    if ref is None:
        end = LogPageEnd(next_cursor=None, finished=ended, attempt=None)
        return Response(end.model_dump_json() + "\n", media_type=NDJSON)
    out: list[str] = []
    finished = False
    for _ in range(MAX_READS):
        before = inner
        try:
            chunk = reader.read_logs(ref, rank=rank, cursor=inner, limit=limit - len(out))
        except OutputsError as exc:
            raise _api_error(exc) from exc
        out += [json.dumps(_line_out(ref.attempt, line)) for line in chunk.lines]
        inner = chunk.next_cursor
        # ended in the store before the read, and the read found nothing more: not "no lines of this
        # rank in this read" (the cursor moved past other ranks' lines), which is not the end
        if chunk.finished or (ended and not chunk.lines and inner == before):
            finished = True
            break
        if len(out) >= limit or (not chunk.lines and inner == before):
            break
    next_cursor = join_cursor(ref.attempt, inner or "")
    end = LogPageEnd(next_cursor=next_cursor, finished=finished, attempt=ref.attempt)
    out.append(end.model_dump_json())
    return Response("\n".join(out) + "\n", media_type=NDJSON, headers={CURSOR_HEADER: next_cursor})


def _read(reader: LogReader, ref: AttemptRef, rank: int | None, cursor: str | None) -> LogChunk:
    return reader.read_logs(ref, rank=rank, cursor=cursor, limit=FOLLOW_BATCH)




def _state(db: sessionmaker[Session], auth: StreamAuth, job_id: int,
           number: int | None) -> tuple[AttemptRef | None, bool] | str:
    """One look at the store, in one transaction: the caller again (a revoked or expired token ends
    the stream), the job (still visible to it), the attempt and whether it has ended."""
    with db.begin() as session:
        principal = auth(session)
        if principal is None:
            return "unauthorized"
        try:
            job = visible_job(session, principal, job_id)
        except NotFound:
            return "not_found"
        picked = _pick(job, number)
        if picked is None:
            return None, is_terminal(job)
        return _ref(job, picked), _ended(job, picked)


async def follow_logs(db: sessionmaker[Session], reader: LogReader, auth: StreamAuth | str, job_id: int,
                      number: int | None, rank: int | None, cursor: str | None, *, poll_s: float, heartbeat_s: float,
                      token_grace_s: float = DEFAULT_JOB_TOKEN_GRACE_S) -> AsyncIterator[str]:
    """Server-sent events until the attempt has ended and all it printed was sent (`auth`: who it acts
    for, `service.api.stream_auth`; a string is a bearer secret). The end is taken from the store
    before each read, so a read after it has seen everything the attempt wrote."""
    check = as_stream_auth(auth, token_grace_s)
    last_beat = time.monotonic()
    while True:
        try:
            state = await anyio.to_thread.run_sync(_state, db, check, job_id, number)
        except ApiError as exc:
            yield sse_message("error", {"error": {"code": exc.code, "message": exc.message}})
            return
        except Exception:
            log.exception("log stream of job %s: the store did not answer", job_id)
            yield sse_message("error", {"error": {"code": "unavailable", "message": "the database did not answer;"
                                           " reconnect with Last-Event-ID"}})
            return
        if isinstance(state, str):
            message = {"unauthorized": "the token is no longer valid (revoked or expired)",
                       "not_found": f"no job {job_id}"}[state]
            yield sse_message("error", {"error": {"code": state, "message": message}})
            return
        ref, ended = state
        lines: list[LogLine] = []
        if ref is not None:
            number = ref.attempt  # follow this attempt to its end, even if a retry starts another
            before = cursor
            try:
                chunk = await anyio.to_thread.run_sync(_read, reader, ref, rank, cursor)
            except OutputsError as exc:
                error = _api_error(exc)
                yield sse_message("error", {"error": {"code": error.code, "message": error.message}})
                return
            lines, cursor = chunk.lines, chunk.next_cursor
            for line in lines:
                yield sse_message("line", _line_out(ref.attempt, line), join_cursor(ref.attempt, line.cursor))
            if chunk.finished or (ended and not lines and cursor == before):
                final = join_cursor(ref.attempt, cursor or "")
                yield sse_message("end", {"next_cursor": final, "attempt": ref.attempt}, final)
                return
        elif ended:  # the job ended before any attempt started
            yield sse_message("end", {"next_cursor": None, "attempt": None})
            return
        if lines:
            last_beat = time.monotonic()
            continue
        if time.monotonic() - last_beat >= heartbeat_s:
            last_beat = time.monotonic()
            yield KEEP_ALIVE
        await anyio.sleep(poll_s)


def _attempt_for_outputs(request: Request, db: sessionmaker[Session], principal: Caller, job_id: int,
                         number: int | None) -> tuple[LogReader, AttemptRef | None]:
    reader = _reader(request)
    with db.begin() as session:
        job = visible_job(session, principal, job_id)
        picked = _pick(job, number)
        return reader, None if picked is None else _ref(job, picked)


@router.get("/{job_id}/artifacts", response_model=ArtifactList, responses=ERRORS,
            summary="The files the job wrote to its output folder (checkpoints, traces, the report)")
def get_artifacts(job_id: JobId, principal: Caller, db: Db, request: Request, attempt: AttemptQ = None) -> ArtifactList:
    reader, ref = _attempt_for_outputs(request, db, principal, job_id, attempt)
    if ref is None:
        return ArtifactList(job_id=job_id, attempt=None, artifacts=[])
    try:
        items = reader.list_artifacts(ref)
    except OutputsError as exc:
        raise _api_error(exc) from exc
    return ArtifactList(job_id=job_id, attempt=ref.attempt, artifacts=items)


@router.get("/{job_id}/artifacts/{path:path}", responses={
    **ERRORS, 200: {"description": "The file's bytes.", "content": {"application/octet-stream": {}}}},
    response_class=Response, summary="Download one small file the job wrote")
def get_artifact(job_id: JobId, path: str, principal: Caller, db: Db, request: Request,
                 attempt: AttemptQ = None) -> Response:
    reader, ref = _attempt_for_outputs(request, db, principal, job_id, attempt)
    if ref is None:
        raise ApiError(404, "not_found", f"job {job_id} has no attempt yet, so no artifacts")
    try:
        data = reader.read_artifact(ref, path, max_bytes=request.app.state.settings.max_artifact_bytes)
    except OutputsError as exc:
        raise _api_error(exc) from exc
    name = re.sub(r"[^A-Za-z0-9._-]", "_", path.rsplit("/", 1)[-1])
    return Response(data, media_type="application/octet-stream",
                    headers={"Content-Disposition": f'attachment; filename="{name}"'})
