"""The event feed: `GET /v1/events` (a page after a cursor) and its live stream (server-sent events,
`GET /v1/events/stream`, or `GET /v1/events` with `Accept: text/event-stream`).

Every job's events in id order, scoped like jobs (a member: its team's; an admin: all), filtered by
team, job and type (exact, or a prefix ending in `.` or `*`). The stream's `id:` is the cursor:
reconnecting with `Last-Event-ID` resumes after it. It is the job event stream's machinery (async
on the event loop, a stream slot per token and in all, the token checked again at every poll, `: keep-alive`
comments), without an end: it runs until the client goes or the token stops working.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Annotated

import anyio
import anyio.to_thread
from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.security import HTTPAuthorizationCredentials
from sqlalchemy.orm import Session, sessionmaker

from service.api.deps import Caller, Db, bearer
from service.api.errors import ApiError
from service.api.notify_schemas import EventPage, FeedEventOut
from service.api.schemas import ErrorResponse
from service.api.sse import KEEP_ALIVE, sse_message, stream_error
from service.api.stream_auth import StreamAuth, as_stream_auth, for_stream
from service.api.streams import EVENT_ID, EVENT_STREAM, HEARTBEAT_S, EventStreamResponse
from service.names import Label
from service.store.event_feed import MAX_FEED_PAGE, FeedEvent, FeedFilter, list_feed
from service.store.tokens import Principal

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/events", tags=["events"])

Since = Annotated[int, Query(ge=0, le=2**63 - 1, description="The cursor: only events with a larger id.")]
TeamQ = Annotated[Label | None, Query(description="Only this team's jobs' events.")]
JobQ = Annotated[int | None, Query(ge=1, le=2**63 - 1, description="Only this job's events.")]
TypeQ = Annotated[str | None, Query(max_length=64, description="An event type (job.failed), or a prefix ending"
                                    " in '.' or '*' (job.).")]
FEED_RESPONSES: dict[int | str, dict[str, object]] = {
    200: {"description": "A page of events as JSON, or with `Accept: text/event-stream` (or ?stream=true) a live"
          " stream: one `id:`/`event: <kind>`/`data: <FeedEventOut JSON>` message per event and `: keep-alive`"
          " comments, until the client goes (`event: error` when the token stops working).",
          "content": {EVENT_STREAM: {"schema": {"type": "string"}}}},
    400: {"model": ErrorResponse, "description": "Last-Event-ID is not an event id."},
    429: {"model": ErrorResponse, "description": "Too many live streams for this token or this server."},
}
LastEventId = Annotated[str, Header(description="Resume a stream after this event id (what it sent as `id:`).",
                                    json_schema_extra={"pattern": f"^{EVENT_ID.pattern}$"})]


def feed_out(row: FeedEvent) -> FeedEventOut:
    e = row.event
    return FeedEventOut(id=e.id, job_id=e.job_id, job_name=row.job_name, team=row.team, at=e.at, actor=e.actor,
                        kind=e.kind, message=e.message, data=e.data)




def _poll(db: sessionmaker[Session], auth: StreamAuth, filters: FeedFilter, after: int) -> list[FeedEventOut] | None:
    """One poll in one transaction: the caller again (None when it stopped working), then the events."""
    with db.begin() as session:
        principal = auth(session)
        if principal is None:
            return None
        return [feed_out(row) for row in list_feed(session, principal, filters, since=after, limit=MAX_FEED_PAGE)]


async def feed_stream(db: sessionmaker[Session], auth: StreamAuth | str, filters: FeedFilter, after: int,
                      poll_s: float, token_grace_s: float, heartbeat_s: float = HEARTBEAT_S) -> AsyncIterator[str]:
    """Server-sent events, one per event after `after`, until the caller's token stops working (`auth`:
    `service.api.stream_auth`; a string is a bearer secret)."""
    check = as_stream_auth(auth, token_grace_s)
    last_beat = time.monotonic()
    while True:
        try:
            events = await anyio.to_thread.run_sync(_poll, db, check, filters, after)
        except Exception:  # the database went away: say so, rather than cut the stream mid-message
            log.exception("event feed stream: poll failed")
            yield stream_error("unavailable")
            return
        if events is None:
            yield stream_error("unauthorized")
            return
        for event in events:
            after = event.id
            yield sse_message(event.kind, event.model_dump(mode="json"), event.id)
        if time.monotonic() - last_beat > heartbeat_s:
            last_beat = time.monotonic()
            yield KEEP_ALIVE
        if not events:
            await anyio.sleep(poll_s)


def _stream(request: Request, principal: Principal, credentials: HTTPAuthorizationCredentials | None,
            filters: FeedFilter, since: int, last_event_id: str) -> EventStreamResponse:
    if last_event_id and EVENT_ID.fullmatch(last_event_id) is None:  # empty: none, as EventSource means it
        raise ApiError(400, "bad_request", "Last-Event-ID must be an event id: 1 to 18 digits")
    settings = request.app.state.settings
    auth = for_stream(principal, credentials, settings.job_token_grace_s)
    release = request.app.state.streams.acquire(principal.token_id, total=settings.max_streams,
                                                per_token=settings.max_streams_per_token)
    start = int(last_event_id) if last_event_id else since
    return EventStreamResponse(feed_stream(request.app.state.sessions, auth, filters, start,
                                           settings.events_poll_s, settings.job_token_grace_s), release)


@router.get("", response_model=EventPage, responses=FEED_RESPONSES,
            summary="Events of every visible job after a cursor; `Accept: text/event-stream` (or ?stream=true)"
                    " follows them live")
def get_feed(principal: Caller, db: Db, request: Request,
             credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
             since: Since = 0, team: TeamQ = None, job: JobQ = None, type: TypeQ = None,
             limit: Annotated[int, Query(ge=1, le=MAX_FEED_PAGE)] = 100, stream: bool = False) -> object:
    """A stream resumes after its `Last-Event-ID` header (read here rather than declared, as it only
    applies to the stream)."""
    filters = FeedFilter(team=team, job_id=job, type=type)
    if stream or EVENT_STREAM in request.headers.get("accept", ""):
        return _stream(request, principal, credentials, filters, since, request.headers.get("last-event-id", ""))
    with db.begin() as session:
        items = [feed_out(row) for row in list_feed(session, principal, filters, since=since, limit=limit)]
    return EventPage(items=items, next_cursor=str(items[-1].id if items else since))


@router.get("/stream", responses=FEED_RESPONSES, include_in_schema=False,
            summary="The live stream of `GET /v1/events` (server-sent events; never ends by itself)")
def get_feed_stream(principal: Caller, request: Request,
                    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
                    since: Since = 0, team: TeamQ = None, job: JobQ = None, type: TypeQ = None,
                    last_event_id: LastEventId = "") -> EventStreamResponse:
    """Left out of the OpenAPI document (which describes the same stream on `GET /v1/events`) because
    it never ends, so that clients generated from the document do not wait on it."""
    return _stream(request, principal, credentials, FeedFilter(team=team, job_id=job, type=type), since,
                   last_event_id)
