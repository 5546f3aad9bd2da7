"""Bodies of the dashboard's POSTs: small URL-encoded forms only.

The API's request gate gives form routes the trace-upload limit (`max_upload_bytes`), and the
dashboard's forms need no token, so `UiBodyLimit` (a plain ASGI middleware inside the gate) holds
POSTs under `/ui/` to `application/x-www-form-urlencoded` (else 415) of at most `MAX_FORM_BYTES`
(else 413: at once for a `Content-Length` over it, or as soon as a chunked body passes it).
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.body_limit import counted

MAX_FORM_BYTES = 64 * 1024
FORM = "application/x-www-form-urlencoded"


class UiBodyLimit:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].startswith("/ui/"):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        media = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if media and media != FORM:
            await PlainTextResponse(f"Content-Type {media!r} is not accepted here: the dashboard's forms send {FORM}",
                                    status_code=415)(scope, receive, send)
            return
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_FORM_BYTES):
            await PlainTextResponse(f"form over {MAX_FORM_BYTES} bytes", status_code=413)(scope, receive, send)
            return
        await self.app(scope, counted(receive, MAX_FORM_BYTES, "form"), send)
