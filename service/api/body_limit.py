"""One way to hold a request body to a size while it streams in, for the API's request gate and the
dashboard's form limit."""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import Message, Receive


def counted(receive: Receive, limit: int, what: str = "request body") -> Receive:
    """`receive` that refuses (413, "<what> over <limit> bytes") the first chunk that takes the body over
    `limit` bytes."""
    size = 0

    async def counting() -> Message:
        nonlocal size
        message = await receive()
        if message["type"] == "http.request":
            size += len(message.get("body", b""))
            if size > limit:
                raise HTTPException(413, f"{what} over {limit} bytes")
        return message

    return counting


__all__ = ["counted"]
