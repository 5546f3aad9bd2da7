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

The reading itself is `service.api.ops.logs`'s, which the dashboard's log view follows too.
"""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.security import HTTPAuthorizationCredentials

from service.api.deps import Caller, Db, bearer
from service.api.errors import ApiError
from service.api.ops.logs import (
    ArtifactList,
    artifact,
    artifact_list,
    follow_logs,
    log_page,
    log_target,
    require_reader,
    split_cursor,
)
from service.api.routers.jobs import JobId
from service.api.schemas import ErrorResponse
from service.api.stream_auth import for_stream
from service.api.streams import EVENT_STREAM, EventStreamResponse
from service.joblogs import MAX_CURSOR_CHARS

router = APIRouter(prefix="/v1/jobs", tags=["logs"])

NDJSON = "application/x-ndjson"
CURSOR_HEADER = "Shardctl-Next-Cursor"
#: Lines one page (without follow) holds by default, and at most.
DEFAULT_LIMIT, MAX_LIMIT = 1000, 10_000
RankQ = Annotated[int | None, Query(ge=0, le=1_000_000, description="Only this global rank's lines.")]
AttemptQ = Annotated[int | None, Query(ge=1, le=1_000_000, description="The attempt number (default: the"
                                       " latest, or the cursor's).")]


ERRORS: dict[int | str, dict[str, object]] = {
    400: {"model": ErrorResponse, "description": "A cursor (or Last-Event-ID) this server did not make."},
    404: {"model": ErrorResponse}, 409: {"model": ErrorResponse, "description": "`not_available`: the job's"
                                         " backend cannot show this here (not configured on this server, or"
                                         " no folder it can read, as on Kubernetes); `too_large`: an artifact"
                                         " over SHARDCTL_MAX_ARTIFACT_BYTES."},
    503: {"model": ErrorResponse, "description": "The backend did not answer; try again."}}


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
    reader = require_reader(request.app.state.log_reader)
    from_attempt, inner = split_cursor(last_event_id or cursor)
    if attempt is not None and from_attempt is not None and attempt != from_attempt:
        raise ApiError(400, "bad_request", f"the cursor is of attempt {from_attempt}, not {attempt}")
    number = attempt if attempt is not None else from_attempt
    target = log_target(db, principal, job_id, number)
    if follow:
        settings = request.app.state.settings
        auth = for_stream(principal, credentials, settings.job_token_grace_s)
        release = request.app.state.log_followers.acquire(settings.max_log_followers)
        stream = follow_logs(db, reader, auth, job_id, number, rank, inner,
                             poll_s=settings.logs_poll_s, heartbeat_s=settings.logs_heartbeat_s,
                             token_grace_s=settings.job_token_grace_s)
        return EventStreamResponse(stream, release)
    page = log_page(reader, target, rank, inner, limit)
    headers = {CURSOR_HEADER: page.next_cursor} if page.next_cursor is not None else None
    return Response(page.text, media_type=NDJSON, headers=headers)


@router.get("/{job_id}/artifacts", response_model=ArtifactList, responses=ERRORS,
            summary="The files the job wrote to its output folder (checkpoints, traces, the report)")
def get_artifacts(job_id: JobId, principal: Caller, db: Db, request: Request, attempt: AttemptQ = None) -> ArtifactList:
    return artifact_list(db, require_reader(request.app.state.log_reader), principal, job_id, attempt)


@router.get("/{job_id}/artifacts/{path:path}", responses={
    **ERRORS, 200: {"description": "The file's bytes.", "content": {"application/octet-stream": {}}}},
    response_class=Response, summary="Download one small file the job wrote")
def get_artifact(job_id: JobId, path: str, principal: Caller, db: Db, request: Request,
                 attempt: AttemptQ = None) -> Response:
    data = artifact(db, require_reader(request.app.state.log_reader), principal, job_id, path, attempt,
                    max_bytes=request.app.state.settings.max_artifact_bytes)
    name = re.sub(r"[^A-Za-z0-9._-]", "_", path.rsplit("/", 1)[-1])
    return Response(data, media_type="application/octet-stream",
                    headers={"Content-Disposition": f'attachment; filename="{name}"'})
