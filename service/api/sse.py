"""Server-sent events as the API's streams write them (job events, the event feed, logs)."""

from __future__ import annotations

import json

#: A comment line: keeps proxies from closing an idle stream; clients ignore it.
KEEP_ALIVE = ": keep-alive\n\n"


def sse_message(kind: str, data: object, event_id: int | str | None = None) -> str:
    """One message: `id:` (what a client resumes from with `Last-Event-ID`), `event:` and JSON `data:`."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {kind}\ndata: {json.dumps(data)}\n\n"
