"""A job's logs and artifacts, read from its backend on demand through a `LogReader`
(`service.api.logs_source`); nothing is copied into the database.

- `log_target`: the attempt a read is of (the latest unless one is named), with `GET /v1/jobs/{id}`'s
  visibility; `log_page`: one page of its lines as NDJSON; `follow_logs`: its lines live, as
  server-sent events, until the attempt has ended and all it printed was sent.
- `artifact_list`, `artifact`: the files under an attempt's output folder, and one of them.

A cursor is `<attempt>.<backend cursor>` (`split_cursor`, `join_cursor`): resuming reads the
attempt it came from. The backend's errors become the API's (`outputs_error`): 409 `not_available`
(this server or backend cannot), 400 for a cursor or path it did not make, 404, 409 `too_large`,
503 when the backend did not answer.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio
import anyio.to_thread
from pydantic import BaseModel, Field
from sqlalchemy.orm import Session, sessionmaker

from service.api.errors import ApiError
from service.api.logs_source import LogReader
from service.api.sse import KEEP_ALIVE, sse_message, stream_error
from service.api.stream_auth import StreamAuth, as_stream_auth
from service.joblogs import (
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
from service.store.tokens import DEFAULT_JOB_TOKEN_GRACE_S, NotFound, Principal
from service.store.vocab import AttemptStatus

log = logging.getLogger(__name__)

#: Lines a live stream asks the backend for at once.
FOLLOW_BATCH = 500
#: Backend reads one page may make to fill `limit` (each reads a bounded number of bytes per source).
MAX_READS = 64
_CURSOR = re.compile(r"^([0-9]{1,6})\.([A-Za-z0-9_-]*)$")
_ENDED = frozenset({AttemptStatus.SUCCEEDED, AttemptStatus.FAILED, AttemptStatus.CANCELLED, AttemptStatus.MISSING,
                    AttemptStatus.PREEMPTED})


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


@dataclass(frozen=True, slots=True)
class LogTarget:
    """The attempt a read is of (None: the job has none yet) and whether it has ended (without an
    attempt: whether the job has)."""

    ref: AttemptRef | None
    ended: bool


@dataclass(frozen=True, slots=True)
class LogPage:
    """One page: the NDJSON text (each line's object, then a `LogPageEnd`) and its next cursor (None
    while the job has no attempt)."""

    text: str
    next_cursor: str | None


def require_reader(reader: LogReader | None) -> LogReader:
    """`reader`, or a 409 `not_available` on a server started without one."""
    if reader is None:
        raise ApiError(409, "not_available", "this server reads no backend logs or artifacts (it was started"
                       " without them; `shardctl serve` wires them)")
    return reader


def outputs_error(exc: OutputsError) -> ApiError:
    """The API's answer to a backend's `OutputsError`."""
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


def log_target(db: sessionmaker[Session], principal: Principal, job_id: int, number: int | None) -> LogTarget:
    """Attempt `number` of job `job_id` (None: the latest), as `principal` may see the job: `NotFound`
    otherwise, a 404 for an attempt the job does not have."""
    with db.begin() as session:
        job = visible_job(session, principal, job_id)
        picked = _pick(job, number)
        if picked is None:
            return LogTarget(None, is_terminal(job))
        return LogTarget(_ref(job, picked), _ended(job, picked))


def log_page(reader: LogReader, target: LogTarget, rank: int | None, cursor: str | None, limit: int) -> LogPage:
    """At most `limit` lines of `target` after the backend cursor `cursor` (only `rank`'s when given),
    read in at most `MAX_READS` backend reads; `finished` once the attempt has ended and this is the
    end of its output."""
    ref = target.ref
    if ref is None:
        return LogPage(LogPageEnd(next_cursor=None, finished=target.ended, attempt=None).model_dump_json() + "\n",
                       None)
    out: list[str] = []
    finished = False
    inner = cursor
    for _ in range(MAX_READS):
        before = inner
        try:
            chunk = reader.read_logs(ref, rank=rank, cursor=inner, limit=limit - len(out))
        except OutputsError as exc:
            raise outputs_error(exc) from exc
        out += [json.dumps(_line_out(ref.attempt, line)) for line in chunk.lines]
        inner = chunk.next_cursor
        # ended in the store before the read, and the read found nothing more: not "no lines of this
        # rank in this read" (the cursor moved past other ranks' lines), which is not the end
        if chunk.finished or (target.ended and not chunk.lines and inner == before):
            finished = True
            break
        if len(out) >= limit or (not chunk.lines and inner == before):
            break
    next_cursor = join_cursor(ref.attempt, inner or "")
    out.append(LogPageEnd(next_cursor=next_cursor, finished=finished, attempt=ref.attempt).model_dump_json())
    return LogPage("\n".join(out) + "\n", next_cursor)


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
            yield stream_error(exc.code, exc.message)
            return
        except Exception:
            log.exception("log stream of job %s: the store did not answer", job_id)
            yield stream_error("unavailable")
            return
        if isinstance(state, str):
            yield stream_error(state, f"no job {job_id}" if state == "not_found" else None)
            return
        ref, ended = state
        lines: list[LogLine] = []
        if ref is not None:
            number = ref.attempt  # follow this attempt to its end, even if a retry starts another
            before = cursor
            try:
                chunk = await anyio.to_thread.run_sync(_read, reader, ref, rank, cursor)
            except OutputsError as exc:
                error = outputs_error(exc)
                yield stream_error(error.code, error.message)
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


def artifact_list(db: sessionmaker[Session], reader: LogReader, principal: Principal, job_id: int,
                  number: int | None) -> ArtifactList:
    """The files under the output folder of attempt `number` (None: the latest) of job `job_id`, as
    `principal` may see it; an empty list before the first attempt."""
    target = log_target(db, principal, job_id, number)
    if target.ref is None:
        return ArtifactList(job_id=job_id, attempt=None, artifacts=[])
    try:
        items = reader.list_artifacts(target.ref)
    except OutputsError as exc:
        raise outputs_error(exc) from exc
    return ArtifactList(job_id=job_id, attempt=target.ref.attempt, artifacts=items)


def artifact(db: sessionmaker[Session], reader: LogReader, principal: Principal, job_id: int, path: str,
             number: int | None, *, max_bytes: int) -> bytes:
    """The bytes of `path` under the output folder of attempt `number` (None: the latest) of job
    `job_id`, as `principal` may see it: a 404 before the first attempt, a 409 `too_large` over
    `max_bytes`."""
    target = log_target(db, principal, job_id, number)
    if target.ref is None:
        raise ApiError(404, "not_found", f"job {job_id} has no attempt yet, so no artifacts")
    try:
        return reader.read_artifact(target.ref, path, max_bytes=max_bytes)
    except OutputsError as exc:
        raise outputs_error(exc) from exc
