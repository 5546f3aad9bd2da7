"""The FastAPI application: `create_app()` wires settings, database, routers, errors and metrics.

Every request passes the request gate (`RequestGate`, an ASGI middleware) before any route reads a
body: it checks the token of a route that needs one, the media type, the body's size as it arrives
and that a JSON body can be stored, so that a route only ever sees a body it can keep and read back.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

import anyio.to_thread
from fastapi import FastAPI, params
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from sqlalchemy import Engine
from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api import errors
from service.api.access_log import ROUTE_SCOPE_KEY, AccessLog, route_template
from service.api.analysis import AnalysisPool
from service.api.body_limit import counted
from service.api.collector import freeze_startup_objects
from service.api.deps import (
    BAD_TOKEN,
    MAX_JSON_DEPTH,
    MISSING_TOKEN,
    PRINCIPAL_SCOPE_KEY,
    UNAUTHORIZED_HEADERS,
    MalformedJson,
    Unstorable,
    bearer,
    bearer_secret,
    forwarded_identity,
    get_principal,
    parse_storable_json,
    require_admin,
    require_person,
    require_reporter,
    token_principal,
)
from service.api.errors import ApiError, RouteEntry, routes_of
from service.api.logs_source import LogReader
from service.api.metrics import make_metrics
from service.api.query_check import QueryKeys, query_keys, query_problem
from service.api.routers import calibration as calibration_routes
from service.api.routers import events, health, job_batches, jobs, logs, plans, profiles, teams, tokens, webhooks
from service.api.routers import pools as pool_routes
from service.api.routers import scheduling as scheduling_routes
from service.api.schemas import ErrorField
from service.api.shortcuts import Shortcut, ShortcutRequest, ShortcutThreads
from service.api.streams import Followers, StreamSlots
from service.api.submission import PlanRunner
from service.api.ui import mount_ui
from service.api.ui.docs_assets import mount_docs
from service.planner.result import Plan
from service.settings import Settings
from service.spec import TrainingSpec
from service.store.calibration import CalibrationSource
from service.store.db import make_engine, make_sessionmaker
from service.store.known_tokens import KnownTokens
from service.store.tokens import Principal

LaunchPreview = Callable[[TrainingSpec, Plan], dict[str, Any] | None]
BodyKind = Literal["json", "form"] | None


@dataclass(frozen=True, slots=True)
class RouteNeeds:
    """What the request gate checks before a route reads its body."""

    token: bool  # the route needs a bearer token (it depends on `get_principal`)
    roles: bool  # ... of certain roles only (a 403 is possible)
    body: BodyKind  # a JSON body, a form (trace uploads), or none
    query: QueryKeys  # the query parameters it takes (`query_check`)


def _dependants(dependant: Dependant) -> list[Dependant]:
    """`dependant` and every dependency under it."""
    found, stack = [], [dependant]
    while stack:
        item = stack.pop()
        found.append(item)
        stack.extend(item.dependencies)
    return found


def route_needs(route: APIRoute, path: str) -> RouteNeeds:
    """What the gate checks of `route`, served at `path` (its full template)."""
    dependants = _dependants(route.dependant)
    calls = {d.call for d in dependants if d.call is not None}
    body: BodyKind = None
    if route.body_field is not None:
        body = "form" if isinstance(route.body_field.field_info, params.Form) else "json"
    roles = bool(calls & {require_admin, require_person, require_reporter}) or (
        bearer in calls and get_principal not in calls)  # a route that reads the bearer itself (/metrics)
    query = query_keys((f for d in dependants for f in d.query_params), path)
    return RouteNeeds(token=get_principal in calls, roles=roles, body=body, query=query)


def _media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def _is_json(content_type: str) -> bool:
    media = _media_type(content_type)
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def _is_form(content_type: str) -> bool:
    return _media_type(content_type) in ("multipart/form-data", "application/x-www-form-urlencoded")


def _traces_posted_to_profiles(scope: Scope, headers: Headers) -> bool:
    """Trace files (multipart) posted to `/profiles` rather than to `/profiles/traces`."""
    parts = scope["path"].rstrip("/").split("/")
    return (scope["method"] == "POST" and _is_form(headers.get("content-type", ""))
            and len(parts) == 5 and parts[:3] == ["", "v1", "jobs"] and parts[4] == "profiles")


class _Gone(Exception):
    """The client went away while sending its body."""


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole body, or None as soon as it is over `limit` bytes (the rest is never read)."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Gone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _too_large(limit: int) -> Response:
    return errors.error_response(413, "too_large", f"request body over {limit} bytes")


#: Routes whose commonest request the request gate answers itself (see `RequestGate`), each with what
#: it saved against its plain route on 2026-12-07, server CPU per request (route / shortcut) and,
#: where `benchmarks/api_load.py` drives it, requests a second at 16 clients (shortcut / route). None
#: clearly earns 2x alone; without all four the API lost 40% of its throughput and its read p99 goal
#: (benchmarks/results/api_load.md, request_cpu.md).
SHORTCUTS: dict[tuple[str, str], Shortcut] = {
    ("POST", "/v1/jobs"): jobs.create_job_shortcut,  # 1.9x CPU, 1.8x submissions/s
    ("POST", "/v1/jobs/{job_id}/measurements"): jobs.heartbeat_shortcut,  # 1.8x CPU (`request_cpu.py`)
    ("GET", "/v1/jobs/{job_id}"): jobs.job_shortcut,  # 1.6x CPU, 1.6x reads/s
    ("GET", "/v1/jobs"): jobs.jobs_shortcut,  # 1.5x to 2.0x CPU, 1.3x to 1.7x reads/s
}
#: The largest body a shortcut reads before the token is checked: one that came with the headers.
SHORTCUT_BODY_BYTES = 4096


class RequestGate:
    """The checks that come before a route reads a body, in this order:

    1. NUL characters in the path or query: 422 (PostgreSQL text cannot store them). A query parameter
       the route does not take (on `/v1/...`), or one that takes one value given twice: 422 naming it
       (`query_check`).
    2. For a route with a body that needs a token: a missing, malformed, unknown, revoked or expired
       bearer token is a 401 before a byte of the body is read (the principal found is kept for the
       route, so the token is looked up once).
    3. A `Content-Length` over the limit, or a body that goes over it as it arrives (chunked): 413.
       The limit is `max_body_bytes` (1 MiB); trace uploads have `max_upload_bytes` for the whole body.
    4. A body of another media type than the route reads (JSON; multipart for trace uploads): 415.
    5. A JSON body that is malformed: 400 naming where the parser stopped; that holds NUL characters,
       lone surrogates, NaN or Infinity, or nests deeper than `MAX_JSON_DEPTH`: 422 naming the field
       (`invalid_spec` for a spec; a spec's numbers are left to its own range checks, which name the
       range, and `create_job` checks the validated spec again before it is stored).

    A route may have a shortcut (`SHORTCUTS`): the gate answers its commonest request itself, in one
    thread hop that checks the token and does the work, without FastAPI's routing and dependency
    solving (every running job sends a heartbeat every few seconds; dashboards and scripts
    read jobs; tooling submits them). It is tried first, with a bearer token and forwarded identity
    off, and for a route with a body only for a JSON body that declares a length of at most
    `SHORTCUT_BODY_BYTES` (so small it came with the headers; a large one still meets the token check
    before it is read). A request it declines goes through the checks above and on to the route as any
    other, with the principal if the shortcut found it: the answers, and their order, are the same.

    Routes without a body, once their query is checked, and requests no route matches (404, 405),
    pass unread. The gate also times each request to its first response byte, per route template, for
    `/metrics`.
    """

    def __init__(self, app: ASGIApp, api: FastAPI) -> None:
        self.app, self.api = app, api
        self._routes: list[tuple[RouteEntry, RouteNeeds]] | None = None

    def _route(self, scope: Scope) -> tuple[RouteEntry, RouteNeeds] | None:
        if self._routes is None:  # the routes are all there by the first request
            self._routes = [(e, route_needs(e.route, e.path)) for e in routes_of(self.api)
                            if isinstance(e.route, APIRoute)]
        path, method = scope["path"], scope["method"]
        for entry, needs in self._routes:
            if method in entry.methods and entry.regex.match(path):
                return entry, needs
        return None

    def _forwarded(self, scope: Scope, headers: Headers, secret: str | None) -> Principal | None:
        """The principal an authenticating proxy names, when forwarded identity is on (`deps.forwarded_identity`)."""
        settings: Settings = self.api.state.settings
        client = scope.get("client")
        return forwarded_identity(settings, self.api.state.sessions, headers, client[0] if client else None, secret,
                                  str(scope.get("method", "GET")))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, timed = time.perf_counter(), False
        latency = self.api.state.metrics.latency

        async def timed_send(message: Message) -> None:
            nonlocal timed
            if message["type"] == "http.response.start" and not timed:
                timed = True
                latency.labels(method=scope["method"], route=route_template(scope),
                               status=str(message["status"])).observe(time.perf_counter() - start)
            await send(message)

        headers = Headers(scope=scope)
        if _traces_posted_to_profiles(scope, headers):
            # One address for both kinds of profile: a summary (JSON) or the trace files themselves.
            scope["path"] = scope["path"].rstrip("/") + "/traces"
        try:
            answer, receive = await self._admit(scope, headers, receive)
        except _Gone:
            return
        if answer is not None:
            await answer(scope, receive, timed_send)
            return
        await self.app(scope, receive, timed_send)

    async def _admit(self, scope: Scope, headers: Headers, receive: Receive) -> tuple[Response | None, Receive]:
        if "\x00" in scope["path"] or b"%00" in scope.get("query_string", b""):
            return errors.error_response(422, "validation_error", "NUL characters are not allowed in requests"), receive
        found = self._route(scope)
        if found is None:
            return None, receive
        entry, needs = found
        problem = query_problem(needs.query, scope.get("query_string", b""))
        if problem is not None:
            scope[ROUTE_SCOPE_KEY] = entry.path  # the latency metric's label for a request refused here
            loc, message = problem
            return errors.error_response(422, "validation_error", f"invalid request: {loc}: {message}",
                                         fields=[ErrorField(loc=loc, message=message)]), receive
        principal: Principal | None = None
        shortcut = SHORTCUTS.get((scope["method"], entry.path))
        if shortcut is not None:
            scope[ROUTE_SCOPE_KEY] = entry.path  # the latency metric's label for a request answered here
            taken, receive = await self._shortcut(shortcut, entry, needs, scope, headers, receive)
            if isinstance(taken, Response):
                return taken, receive
            principal = taken
        if needs.body is None:
            return None, receive
        scope[ROUTE_SCOPE_KEY] = entry.path  # the latency metric's label for a request refused here
        if needs.token and principal is None:
            secret = bearer_secret(headers.get("authorization"))
            if self.api.state.settings.forwarded_auth:  # off: not a thread hop more per request
                try:
                    principal = await anyio.to_thread.run_sync(self._forwarded, scope, headers, secret)
                except ApiError as exc:
                    return errors.error_response(exc.status, exc.code, exc.message, headers=exc.headers), receive
            if principal is None and secret:
                state = self.api.state
                principal = await anyio.to_thread.run_sync(token_principal, state.engine, secret, state.settings)
            if principal is None:
                return _unauthorized(secret), receive
            scope[PRINCIPAL_SCOPE_KEY] = principal
        settings = self.api.state.settings
        limit: int = settings.max_upload_bytes if needs.body == "form" else settings.max_body_bytes
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            return _too_large(limit), receive
        content_type = headers.get("content-type")
        if needs.body == "form":
            if content_type is not None and not _is_form(content_type):
                return _unsupported(content_type, "multipart/form-data"), receive
            return None, counted(receive, limit)
        if content_type is not None and not _is_json(content_type):
            return _unsupported(content_type, "application/json"), receive
        body = await _read_body(receive, limit)
        if body is None:
            return _too_large(limit), receive
        if body and content_type is None:
            return _unsupported(None, "application/json"), receive
        if body:
            # A spec range-checks its numbers itself, naming the field and its range (see `create_job`).
            spec = (scope["method"], entry.path) in errors.SPEC_BODIES
            try:
                parse_storable_json(body, numbers=not spec)
            except MalformedJson as exc:
                return errors.error_response(400, "bad_request", str(exc)), receive
            except Unstorable as exc:
                code, what = (errors.INVALID_SPEC, "spec") if spec else ("validation_error", "request")
                return errors.error_response(422, code, f"invalid {what}: {exc.loc}: {exc.message}",
                                             fields=[ErrorField(loc=exc.loc, message=exc.message)]), receive
        return None, _replay(body, receive)

    async def _shortcut(self, shortcut: Shortcut, entry: RouteEntry, needs: RouteNeeds, scope: Scope,
                        headers: Headers, receive: Receive) -> tuple[Response | Principal | None, Receive]:
        """The shortcut's answer (or a 401 for the token it looked up), else the principal it found, if
        any, for the checks that follow; with the receive channel they read the body from."""
        secret = bearer_secret(headers.get("authorization"))
        matched = entry.regex.match(scope["path"])
        if secret is None or matched is None or self.api.state.settings.forwarded_auth:
            return None, receive
        value: Any = None
        if needs.body is not None:
            length = headers.get("content-length", "")
            if not _is_json(headers.get("content-type", "")) or not length.isdigit() \
                    or int(length) > SHORTCUT_BODY_BYTES:
                return None, receive
            body = await _read_body(receive, SHORTCUT_BODY_BYTES)
            if body is None:
                return None, receive
            receive = _replay(body, receive)
            try:
                value = parse_storable_json(body)
            except (MalformedJson, Unstorable):  # answered after the token check, as without a shortcut
                return None, receive
        taken = await shortcut(self.api, ShortcutRequest(matched.groupdict(), scope.get("query_string", b""), secret,
                                                          headers, value))
        if taken is None:
            return None, receive
        principal, answer = taken
        if principal is None:
            return _unauthorized(secret), receive
        scope[PRINCIPAL_SCOPE_KEY] = principal
        return answer or principal, receive


def _unauthorized(secret: str | None) -> Response:
    return errors.error_response(401, "unauthorized", BAD_TOKEN if secret else MISSING_TOKEN,
                                 headers=UNAUTHORIZED_HEADERS)


def _unsupported(content_type: str | None, expected: str) -> Response:
    sent = f"Content-Type {content_type!r}" if content_type else "a body without Content-Type"
    return errors.error_response(415, "unsupported_media_type", f"{sent} is not accepted here: send {expected}")


_ERROR_SCHEMA = {"$ref": "#/components/schemas/ErrorResponse"}
_STATUS_DOCS = {
    400: "Malformed JSON (the message names where the parser stopped), or a malformed header.",
    401: "No bearer token, or an unknown, revoked or expired one (`WWW-Authenticate: Bearer`).",
    403: "The token's role may not do this.",
    404: "Nothing by that id that this token may see.",
    413: "The body is over the limit (SHARDCTL_MAX_BODY_BYTES; for trace uploads SHARDCTL_MAX_UPLOAD_BYTES).",
    415: "The body is not of the media type this operation reads.",
    422: "Invalid parameters or body: a field breaks the contract, or a value no database can store (NUL"
         f" characters, lone surrogates, NaN or Infinity, nesting deeper than {MAX_JSON_DEPTH}).",
    503: "Not available now.",
}
#: What the routes cannot say about themselves: statuses and media types outside the JSON routes.
_EXTRA_STATUSES = {("/readyz", "get"): {503}}
_MEDIA_TYPES = {("/metrics", "get"): "text/plain; version=0.0.4; charset=utf-8"}


def document_responses(app: FastAPI, schema: dict[str, Any]) -> dict[str, Any]:
    """Add to each operation of `schema` the statuses that the request gate, authentication and
    validation answer with (every error in the one `ErrorResponse` shape, FastAPI's own 422 model
    included), so that the document lists every status and media type the API returns."""
    schemas = schema.setdefault("components", {}).setdefault("schemas", {})
    for entry in routes_of(app):
        route = entry.route
        if not isinstance(route, APIRoute) or not route.include_in_schema:
            continue
        needs = route_needs(route, entry.path)
        statuses = {422}
        if needs.token or needs.roles:
            statuses.add(401)
        if needs.roles:
            statuses.add(403)
        if needs.body is not None:
            statuses |= {400, 413, 415}
        if route.dependant.path_params:
            statuses.add(404)
        for method in sorted(entry.methods):
            key = (entry.path, method.lower())
            operation = schema["paths"][entry.path][key[1]]
            if not needs.token and operation.get("security"):  # reads a bearer when one is configured
                operation["security"] = [*operation["security"], {}]  # (/metrics): so optional
            responses = operation.setdefault("responses", {})
            for status in sorted(statuses | _EXTRA_STATUSES.get(key, set())):
                doc = responses.setdefault(str(status), {"description": _STATUS_DOCS[status]})
                doc["content"] = {"application/json": {"schema": _ERROR_SCHEMA}}
                if status == 401:
                    doc["headers"] = {"WWW-Authenticate": {"schema": {"type": "string"}}}
            media = _MEDIA_TYPES.get(key)
            if media is not None:
                responses["200"]["content"] = {media: {"schema": {"type": "string"}}}
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    return schema


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Startup: the first app served in a process freezes what is alive then (`service.api.collector`)."""
    freeze_startup_objects()
    yield


def create_app(settings: Settings | None = None, *, engine: Engine | None = None,
               launch_preview: LaunchPreview | None = None,
               configured_backends: Collection[str] | None = None,
               log_reader: LogReader | None = None) -> FastAPI:
    """An app on `settings.database_url` (or `engine`). The schema must be migrated already
    (`shardctl db upgrade`; `shardctl serve` does it). `launch_preview(spec, plan)` renders what a
    backend would be sent; `configured_backends` are the backend kinds the dispatchers run, and a
    spec for another is a 422 at submit (None: not checked). The composition module
    (`service.cli.wiring`) passes both; the API never imports workers. Limits (bodies, uploads,
    live event streams) are `settings` fields. `log_reader` reads jobs' logs and artifacts from their
    backends (`service.api.logs_source`); without it those routes answer 409 `not_available`."""
    settings = settings or Settings()
    engine = engine or make_engine(settings.resolved_database_url)
    app = FastAPI(title="shardctl", version="0.1.0", docs_url=None, redoc_url=None,  # mount_docs: vendored assets
                  description="Plan, launch and track distributed training jobs.", lifespan=_lifespan)
    app.state.settings = settings
    app.state.streams = StreamSlots()
    app.state.analyses = AnalysisPool(settings.profile_workers, settings.profile_queue)
    app.state.planner = PlanRunner.from_settings(settings)
    app.state.engine = engine
    app.state.known_tokens = KnownTokens()
    app.state.shortcut_threads = ShortcutThreads(settings.shortcut_threads)
    app.state.sessions = make_sessionmaker(engine)
    app.state.planner.calibration = CalibrationSource(app.state.sessions, min_runs=settings.calibration_min_runs,
                                                      scope=settings.calibration_scope)
    app.state.metrics = make_metrics(app.state.sessions, team_labels=settings.metrics_team_labels)
    app.state.launch_preview = launch_preview
    app.state.log_reader = log_reader
    app.state.log_followers = Followers()
    app.state.configured_backends = frozenset(configured_backends) if configured_backends is not None else None
    errors.install(app)
    for module in (health, plans, jobs, job_batches, logs, profiles, teams, tokens, events, webhooks):
        app.include_router(module.router)
    for module in (pool_routes, scheduling_routes):  # shared GPUs: pools, quotas, usage, explain
        app.include_router(module.router)
    app.include_router(calibration_routes.router)  # calibration from measurements
    mount_docs(app)
    mount_ui(app)  # the dashboard under /ui/ (service/api/ui, docs/dashboard.md)
    app.add_middleware(RequestGate, api=app)
    app.add_middleware(AccessLog)  # outermost: it logs what the gate refuses too

    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document_responses(app, generate())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
