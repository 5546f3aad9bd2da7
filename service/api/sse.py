"""Server-sent events as the API's streams write them (job events, the event feed, logs)."""

from __future__ import annotations

import json

#: A comment line: keeps proxies from closing an idle stream; clients ignore it.
KEEP_ALIVE = ": keep-alive\n\n"


def sse_message(kind: str, data: object, event_id: int | str | None = None) -> str:
    """One message: `id:` (what a client resumes from with `Last-Event-ID`), `event:` and JSON `data:`."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {kind}\ndata: {json.dumps(data)}\n\n"


#: Why a live stream ends early, as its last message's `code`, with the words a client shows.
ENDINGS = {"unavailable": "the database did not answer; reconnect with Last-Event-ID",
           "unauthorized": "the token is no longer valid (revoked or expired)"}


def stream_error(code: str, message: str | None = None) -> str:
    """The `event: error` message that ends a stream: `code` with `message`, or with the words of
    `ENDINGS` for a code listed there."""
    return sse_message("error", {"error": {"code": code, "message": message or ENDINGS[code]}})
