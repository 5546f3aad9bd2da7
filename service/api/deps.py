"""Typed dependencies: the database, the calling principal, role checks, and the request limits and JSON
checks the request gate (`service.api.app`) applies before a route reads a body."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Annotated, Any

import anyio.to_thread
from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session, sessionmaker

from service.api.errors import ApiError
from service.api.forwarded import TEAM_HEADER, ForwardedRefused, forwarded_principal, is_shardctl_token, read_forwarded
from service.api.ops.access import admin_only
from service.settings import Settings
from service.spec import field_path
from service.store.db import one_statement
from service.store.tokens import Principal, authenticate
from service.store.vocab import Role

bearer = HTTPBearer(auto_error=False, description="A shardctl token: shc_<id>_<secret>.")

#: Where the request gate (before reading a body) or `get_principal` leaves the principal it authenticated.
PRINCIPAL_SCOPE_KEY = "shardctl.principal"
UNAUTHORIZED_HEADERS = {"WWW-Authenticate": "Bearer"}
MISSING_TOKEN = "missing bearer token: send 'Authorization: Bearer shc_...'"
BAD_TOKEN = "unknown, revoked or expired token"


async def get_db(request: Request) -> sessionmaker[Session]:
    """The app's session factory. `async`, as the role checks below: FastAPI runs a plain function
    dependency in a worker thread, a thread hop per dependency on every request for no I/O."""
    factory: sessionmaker[Session] = request.app.state.sessions
    return factory


Db = Annotated[sessionmaker[Session], Depends(get_db)]


def bearer_secret(authorization: str | None) -> str | None:
    """The credentials of an `Authorization: Bearer <credentials>` header (as `HTTPBearer` reads it)."""
    scheme, _, credentials = (authorization or "").partition(" ")
    credentials = credentials.strip()
    return credentials if scheme.lower() == "bearer" and credentials else None


#: Methods a browser may send cross-site without asking (a form, a link): they must not change anything.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
CROSS_SITE = ("a request that changes something, made as a user the proxy signed in, must come from this site: a"
              " browser page on another site cannot act for them. Scripts and tools send the header"
              " 'X-Requested-With: shardctl' (a form on another site cannot send it)")


def same_site(headers: Mapping[str, str]) -> bool:
    """Whether a request that relies on a browser's sign-in (the proxy's cookie) was not forged by another
    site: `X-Requested-With` (a cross-site form cannot send it, and sending it cross-site needs a CORS
    preflight this API never answers), or the browser's own `Sec-Fetch-Site` saying same-origin or none."""
    return bool(headers.get("x-requested-with")) or headers.get("sec-fetch-site", "") in ("same-origin", "none")


def forwarded_identity(settings: Settings, sessions: sessionmaker[Session], headers: Mapping[str, str],
                       client_host: str | None, secret: str | None, method: str = "GET") -> Principal | None:
    """The principal an authenticating proxy names (`service.api.forwarded`), or None: forwarded identity
    is off, the peer is not a trusted proxy, no user header came, or a shardctl token came (it wins).
    Raises `ApiError` (400, 403) when the proxy names a user who may not act, and 403 for a `method`
    that changes something without proof it came from this site (`same_site`: the proxy's sign-in is a
    cookie, which a browser also sends with another site's forms). Live streams accept it too
    (`service.api.stream_auth`)."""
    if not settings.forwarded_auth or is_shardctl_token(secret):
        return None
    try:
        who = read_forwarded(settings, headers, client_host)
        if who is None:
            return None
        if method.upper() not in SAFE_METHODS and not same_site(headers):
            raise ApiError(403, "forbidden", CROSS_SITE)
        return forwarded_principal(settings, sessions, who, (headers.get(TEAM_HEADER) or "").strip() or None)
    except ForwardedRefused as exc:
        raise ApiError(exc.status, "forbidden" if exc.status == 403 else "bad_request", exc.message) from None


async def get_principal(request: Request,
                        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> Principal:
    """The caller: what the request gate found already (routes with a body), or else looked up in a
    worker thread (the database is blocking I/O). The sessions are the app's, read here rather than
    through `Db`: every dependency FastAPI solves costs each request of every route."""
    known = request.scope.get(PRINCIPAL_SCOPE_KEY)
    if isinstance(known, Principal):  # the request gate checked this request's token already
        return known
    return await anyio.to_thread.run_sync(_principal, request, request.app.state.sessions, credentials)


def token_principal(engine: Engine, secret: str, settings: Settings) -> Principal | None:
    """The principal behind a bearer secret, or None (`authenticate`). One read on a Core connection
    outside a transaction (`one_statement`): no ORM session, no BEGIN and COMMIT around it."""
    with one_statement(engine) as conn:
        return connection_principal(conn, secret, settings)


def connection_principal(conn: Connection, secret: str, settings: Settings) -> Principal | None:
    """`token_principal` on a connection the caller holds: a request-gate shortcut's, which then does its
    route's work on it (`service.api.app.SHORTCUTS`)."""
    return authenticate(conn, secret, job_token_grace_s=settings.job_token_grace_s)


def _principal(request: Request, db: sessionmaker[Session], credentials: HTTPAuthorizationCredentials | None
               ) -> Principal:
    settings: Settings = request.app.state.settings
    if settings.forwarded_auth:
        forwarded = forwarded_identity(settings, db, request.headers,
                                       request.client.host if request.client else None,
                                       credentials.credentials if credentials else None, request.method)
        if forwarded is not None:
            request.scope[PRINCIPAL_SCOPE_KEY] = forwarded
            return forwarded
    if credentials is None:
        raise ApiError(401, "unauthorized", MISSING_TOKEN, headers=UNAUTHORIZED_HEADERS)
    principal = token_principal(request.app.state.engine, credentials.credentials, settings)
    if principal is None:
        raise ApiError(401, "unauthorized", BAD_TOKEN, headers=UNAUTHORIZED_HEADERS)
    request.scope[PRINCIPAL_SCOPE_KEY] = principal  # for the access log (`service.api.access_log`)
    return principal


Caller = Annotated[Principal, Depends(get_principal)]


async def require_admin(principal: Caller) -> Principal:
    admin_only(principal)
    return principal


async def require_person(principal: Caller) -> Principal:
    """Admins and team members; job tokens may only report on their job."""
    if principal.role == Role.JOB:
        raise ApiError(403, "forbidden", "a job token can only report on its own job")
    return principal


async def require_reporter(principal: Caller) -> Principal:
    """A job's own token, or an admin: those who report measurements and profiles on a job."""
    if principal.role == Role.MEMBER:
        raise ApiError(403, "forbidden", "only the job's own token (or an admin) reports on a job")
    return principal


Admin = Annotated[Principal, Depends(require_admin)]
Person = Annotated[Principal, Depends(require_person)]
Reporter = Annotated[Principal, Depends(require_reporter)]


# --- Storable JSON: what either database can store and every response can read back ---------------

#: Deepest nesting of objects and arrays a request body may have (the top level is 1).
MAX_JSON_DEPTH = 32
_SURROGATE = re.compile("[\ud800-\udfff]")
_UNPRINTABLE = re.compile("[\x00\ud800-\udfff]")


class MalformedJson(ValueError):
    """A body that is not JSON (a 400 naming where the parser stopped)."""


class Unstorable(ValueError):
    """JSON that neither database can store, or no response could carry back (a 422 naming the field)."""

    def __init__(self, loc: str, message: str) -> None:
        super().__init__(f"{loc}: {message}")
        self.loc, self.message = loc, message


def _text_problem(text: str) -> str | None:
    if "\x00" in text:
        return "NUL characters are not allowed in requests"
    surrogate = _SURROGATE.search(text)
    if surrogate is not None:
        return f"a lone UTF-16 surrogate (\\u{ord(surrogate.group()):04x}) is not a character; send valid Unicode"
    return None


def check_storable(value: Any, *, max_depth: int = MAX_JSON_DEPTH, numbers: bool = True) -> None:
    """Raise `Unstorable` for NUL characters (PostgreSQL text refuses them), lone surrogates (not
    UTF-8: PostgreSQL refuses them, SQLite stores what no response can encode), NaN and Infinity
    (JSONB refuses them, JSON has no such numbers; not checked with `numbers` False, for a body
    whose model range-checks every number itself and names the range), or nesting deeper than
    `max_depth`. Iterative: a deep document costs no recursion."""
    stack: list[tuple[Any, tuple[int | str, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        problem: str | None = None
        children: list[tuple[int | str, Any]] = []
        if isinstance(item, str):
            problem = _text_problem(item)
        elif isinstance(item, float) and numbers and not math.isfinite(item):
            problem = "NaN and Infinity are not JSON numbers and cannot be stored"
        elif isinstance(item, dict):
            children = list(item.items())
        elif isinstance(item, list | tuple):
            children = list(enumerate(item))
        if isinstance(item, dict | list | tuple) and len(path) >= max_depth:
            problem = f"nested deeper than {max_depth} levels of objects and arrays"
        if problem is not None:
            raise Unstorable(_loc(path), problem)
        for key, child in reversed(children):
            if isinstance(key, str) and (key_problem := _text_problem(key)) is not None:
                raise Unstorable(_loc((*path, key)), f"the key: {key_problem}")
            stack.append((child, (*path, key)))


def _loc(path: tuple[int | str, ...]) -> str:
    """The dotted path, with NUL and surrogates escaped so that the error itself can be sent."""
    return _UNPRINTABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", field_path(path)) or "body"


def _describe(error: ValueError) -> str:
    if isinstance(error, UnicodeDecodeError):
        return f"the body is not UTF-8 text (byte {error.start})"
    return str(error)


def parse_storable_json(body: bytes, *, max_depth: int = MAX_JSON_DEPTH, numbers: bool = True) -> Any:
    """The JSON document `body`, checked by `check_storable`. Raises `MalformedJson` for a body that is
    not JSON and `Unstorable` for one that cannot be stored."""
    try:
        value = json.loads(body)
    except json.JSONDecodeError as exc:
        raise MalformedJson(f"malformed JSON at line {exc.lineno} column {exc.colno} (character {exc.pos}):"
                            f" {exc.msg}") from exc
    except RecursionError as exc:
        raise Unstorable("body", f"nested deeper than {max_depth} levels of objects and arrays") from exc
    except ValueError as exc:  # not UTF-8/16/32, or an integer with more digits than Python converts
        raise MalformedJson(f"malformed JSON: {_describe(exc)}") from exc
    check_storable(value, max_depth=max_depth, numbers=numbers)
    return value
