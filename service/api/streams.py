"""Live streams as every transport sends them: the job event stream, the event feed and the log
stream of the API, and the dashboard's live parts (`service.api.ui.live`).

- `EventStreamResponse`: a server-sent-events response that stops when the client goes away and
  gives its stream slot back however it ends (each message is written by `service.api.sse`).
- `StreamSlots` (event streams, in all and per token) and `Followers` (log streams, in all): the
  slots a stream takes, so that streams cannot take every connection and database poll the other
  endpoints need; a full one is a 429 with Retry-After.
- `EVENT_ID` (an event id as a stream sends it and a reconnecting client sends it back as
  `Last-Event-ID`), `HEARTBEAT_S` (how long an idle event stream waits before a keep-alive).
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import suppress

import anyio
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from service.api.errors import ApiError

EVENT_STREAM = "text/event-stream"
#: An event id as the stream sends it: digits, and small enough for a BIGINT comparison.
EVENT_ID = re.compile(r"[0-9]{1,18}")
HEARTBEAT_S = 15.0


class StreamSlots:
    """The live event streams of this process, in all and per token, so that streams cannot take
    every connection and database poll the other endpoints need."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: Counter[str] = Counter()

    @property
    def total(self) -> int:
        with self._lock:
            return sum(self._open.values())

    def acquire(self, token_id: str, *, total: int, per_token: int) -> Callable[[], None]:
        """Take a slot for `token_id`; returns the (idempotent) release. `ApiError` 429 when full."""
        with self._lock:
            if self._open[token_id] >= per_token:
                raise _too_many(f"this token has {self._open[token_id]} live event streams open (at most"
                                f" {per_token})")
            if sum(self._open.values()) >= total:
                raise _too_many(f"this server has its {total} live event streams open (at most {total})")
            self._open[token_id] += 1

        def release() -> None:
            with self._lock:
                self._open[token_id] -= 1
                if self._open[token_id] <= 0:
                    del self._open[token_id]

        return once(release)


def _too_many(why: str) -> ApiError:
    return ApiError(429, "too_many_requests", f"{why}; close one, or read GET .../events?after=<id> without"
                    " streaming", headers={"Retry-After": "5"})


class Followers:
    """The live log streams of this process, so that followers cannot take every connection."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.open = 0

    def acquire(self, limit: int) -> Callable[[], None]:
        """Take a slot; returns the (idempotent) release. `ApiError` 429 when `limit` are open."""
        with self._lock:
            if self.open >= limit:
                raise ApiError(429, "too_many_requests", f"this server has its {limit} live log streams open (at"
                               f" most {limit}, SHARDCTL_MAX_LOG_FOLLOWERS); read pages without follow, or retry",
                               headers={"Retry-After": "5"})
            self.open += 1

        def release() -> None:
            with self._lock:
                self.open -= 1

        return once(release)


def once(action: Callable[[], None]) -> Callable[[], None]:
    """`action` as a callable that does it on its first call only, from any thread: a slot's release,
    which every way a stream can end calls."""
    lock, done = threading.Lock(), [False]

    def run() -> None:
        with lock:
            if done[0]:
                return
            done[0] = True
        action()

    return run


class EventStreamResponse(StreamingResponse):
    """Server-sent events that stop when the client goes away (whatever the ASGI version), and give
    their stream slot back however they end."""

    def __init__(self, content: AsyncIterator[str], release: Callable[[], None]) -> None:
        super().__init__(content, media_type=EVENT_STREAM,
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:

                async def stream() -> None:
                    with suppress(OSError):  # the client went away mid-write
                        await self.stream_response(send)
                    group.cancel_scope.cancel()

                group.start_soon(stream)
                await self.listen_for_disconnect(receive)
                group.cancel_scope.cancel()
        finally:
            self.release()
