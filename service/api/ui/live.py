"""Live parts of pages: server-sent events that carry rendered HTML.

A page element with `data-live="<url>"` opens an `EventSource` on that URL (`static/app.js`). The
stream sends:

- `event: html`, data `{"target": "<element id>", "swap": "outer"|"inner"|"append"|"prepend",
  "html": "..."}`: the browser puts the (server-rendered, escaped) HTML there;
- `event: end`: nothing more will come (the job finished); the browser closes the stream;
- `event: signed-out`: the session ended (signed out, timed out, or its token revoked or expired); the
  browser reloads (to the sign-in page).

Each message's `id:` is the stream's cursor; a reconnecting browser sends it back as `Last-Event-ID`
and the stream resumes after it. A stream is a `Step` polled every `poll_s` seconds, each poll in one
transaction that looks the session up again (`session.stream_auth`: an ended session ends the stream;
polls do not keep it alive) and hands the step the principal, so visibility is checked on every poll
as in the API. UI streams take the same stream slots as the API's (`SHARDCTL_MAX_STREAMS`,
`..._PER_TOKEN`; a 429 when full).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import anyio
import anyio.to_thread
from fastapi import Request
from sqlalchemy.orm import Session, sessionmaker

from service.api.sse import KEEP_ALIVE, sse_message
from service.api.stream_auth import StreamAuth
from service.api.streams import EVENT_ID, HEARTBEAT_S, EventStreamResponse
from service.api.ui.session import UiSession, stream_auth
from service.store.tokens import Principal

log = logging.getLogger(__name__)


@dataclass
class Batch:
    """What one poll sends: HTML swaps, the new cursor (sent as the last message's id), and whether
    the stream is finished (then `end` follows)."""

    swaps: list[tuple[str, str, str]] = field(default_factory=list)  # (target id, swap, html)
    cursor: int | None = None
    done: bool = False

    def add(self, target: str, html: str, swap: str = "outer") -> None:
        self.swaps.append((target, swap, html))


#: One poll: given a transaction, the principal and the cursor, what to send.
Step = Callable[[Session, Principal, int], Batch]


def resume_cursor(request: Request, default: int) -> int:
    """The cursor a reconnecting browser sent (`Last-Event-ID`), else `default`."""
    sent = request.headers.get("last-event-id", "")
    return int(sent) if EVENT_ID.fullmatch(sent) else default


def _poll(db: sessionmaker[Session], auth: StreamAuth, step: Step, cursor: int) -> Batch | None:
    with db.begin() as session:
        principal = auth(session)
        if principal is None:
            return None
        return step(session, principal, cursor)


async def _messages(db: sessionmaker[Session], auth: StreamAuth, step: Step, cursor: int,
                    poll_s: float) -> AsyncIterator[str]:
    last_beat = time.monotonic()
    while True:
        try:
            batch = await anyio.to_thread.run_sync(_poll, db, auth, step, cursor)
        except Exception:  # the database went away: the browser reconnects with its cursor
            log.exception("dashboard stream: poll failed")
            return
        if batch is None:
            yield sse_message("signed-out", {})
            return
        if batch.cursor is not None:
            cursor = batch.cursor
        for i, (target, swap, html) in enumerate(batch.swaps):
            last = i == len(batch.swaps) - 1
            yield sse_message("html", {"target": target, "swap": swap, "html": html}, cursor if last else None)
        if batch.done:
            yield sse_message("end", {}, cursor)
            return
        if time.monotonic() - last_beat > HEARTBEAT_S:
            last_beat = time.monotonic()
            yield KEEP_ALIVE
        await anyio.sleep(poll_s)


def live_response(request: Request, session: UiSession, step: Step, cursor: int,
                  poll_s: float | None = None) -> EventStreamResponse:
    """The stream of `step`, from `cursor` (or the browser's `Last-Event-ID`)."""
    settings = request.app.state.settings
    release = request.app.state.streams.acquire(session.principal.token_id, total=settings.max_streams,
                                                per_token=settings.max_streams_per_token)
    interval = poll_s if poll_s is not None else max(settings.events_poll_s, 0.05)
    return EventStreamResponse(_messages(request.app.state.sessions, stream_auth(request, session), step,
                                         resume_cursor(request, cursor), interval), release)
