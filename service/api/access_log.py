"""The access log: one line per HTTP request (`shardctl.access`), written when its response ends.

A plain ASGI middleware (not `BaseHTTPMiddleware`, which would buffer streamed responses), installed
outermost so that it also sees what the request gate refuses. Each line carries:

- `method`, `route`: the route's path template (`/v1/jobs/{job_id}`), never the raw path; `unmatched`
  when no route matched (a 404 or 405);
- `status` (500 when the app raised), `latency_ms` (to the response's last byte: a live event stream's
  line comes when it ends), `bytes` (the response body's size);
- `principal`: the public id of the token the request authenticated with (from the scope, where the
  request gate or `get_principal` leaves it), or null; never the token, its secret or any header;
- `request_id`: the client's `X-Request-ID` when it is a plain id (1 to 64 of `A-Za-z0-9._-`), else a
  new one; it is sent back as `X-Request-ID` and added to every log line written while serving it.
"""

from __future__ import annotations

import logging
import re
import time
import uuid

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.deps import PRINCIPAL_SCOPE_KEY
from service.observability.logs import request_id_var
from service.store.tokens import Principal

log = logging.getLogger("shardctl.access")

REQUEST_ID_HEADER = "X-Request-ID"
_PLAIN_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
UNMATCHED = "unmatched"
#: Where the request gate leaves the template of a route it refused before the router ran.
ROUTE_SCOPE_KEY = "shardctl.route"


def route_template(scope: Scope) -> str:
    """The request's route as declared (`/v1/jobs/{job_id}`), never the raw path; `unmatched` for a
    request no route takes. The label of the access log and of the latency metric."""
    return getattr(scope.get("route"), "path", None) or scope.get(ROUTE_SCOPE_KEY) or UNMATCHED


def request_id(headers: Headers) -> str:
    """The client's request id when it is a plain one, else a fresh one."""
    given = headers.get(REQUEST_ID_HEADER, "")
    return given if _PLAIN_ID.fullmatch(given) else uuid.uuid4().hex


class AccessLog:
    """Log one line per request (see the module's docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        rid = request_id(Headers(scope=scope))
        token = request_id_var.set(rid)
        status, sent = 500, 0

        async def logged_send(message: Message) -> None:
            nonlocal status, sent
            if message["type"] == "http.response.start":
                status = message["status"]
                MutableHeaders(scope=message).append(REQUEST_ID_HEADER, rid)
            elif message["type"] == "http.response.body":
                sent += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, logged_send)
        finally:
            self._log(scope, status, sent, start, rid)
            request_id_var.reset(token)

    def _log(self, scope: Scope, status: int, sent: int, start: float, rid: str) -> None:
        route = route_template(scope)
        principal = scope.get(PRINCIPAL_SCOPE_KEY)
        latency_ms = round((time.perf_counter() - start) * 1000, 3)
        method = scope["method"]
        log.info("%s %s %d %.1fms", method, route, status, latency_ms,
                 extra={"method": method, "route": route, "status": status, "latency_ms": latency_ms,
                        "bytes": sent, "request_id": rid,
                        "principal": principal.token_id if isinstance(principal, Principal) else None})
