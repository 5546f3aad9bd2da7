"""One error shape for every failure: {"error": {"code", "message", "fields": [{"loc", "message"}]}}."""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Any

import fastapi.routing
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute, compile_path

from service.api.schemas import ErrorBody, ErrorField, ErrorResponse
from service.planner import InvalidSpec
from service.spec import field_path
from service.store.states import IllegalTransition
from service.store.tokens import Conflict, NotFound

log = logging.getLogger(__name__)


class ApiError(Exception):
    """An error a handler raises on purpose, with its HTTP status and stable code."""

    def __init__(self, status: int, code: str, message: str, *, fields: list[ErrorField] | None = None,
                 details: dict[str, Any] | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.fields, self.details, self.headers = fields or [], details or {}, headers


class _ErrorJson(JSONResponse):
    """JSON in ASCII: an error that quotes what the client sent renders whatever that was (a lone
    surrogate comes back as the escape it came in as)."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode()


def error_response(status: int, code: str, message: str, *, fields: list[ErrorField] | None = None,
                   details: dict[str, Any] | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
    body = ErrorResponse(error=ErrorBody(code=code, message=message, fields=fields or [], details=details or {}))
    return _ErrorJson(body.model_dump(mode="json"), status_code=status, headers=headers)


def database_unavailable(exc: BaseException) -> bool:
    """Whether `exc` says the database could not be reached or dropped the connection (as opposed to a
    statement it refused): connecting failed, or the driver saw the connection end."""
    return isinstance(exc, OperationalError) or (isinstance(exc, DBAPIError) and exc.connection_invalidated)


def _loc(parts: tuple[Any, ...]) -> str:
    return field_path(tuple(p for p in parts if p != "body")) or "body"


_HTTP_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
               405: "method_not_allowed", 409: "conflict", 413: "too_large", 415: "unsupported_media_type",
               422: "validation_error", 429: "too_many_requests"}


#: The one code for a training spec that breaks the contract, whichever layer finds it (pydantic's
#: types and ranges, or the planner's checks against the presets and the GPU catalog).
INVALID_SPEC = "invalid_spec"
#: Routes whose JSON body is a `TrainingSpec` (or, for the batch, a list of them).
SPEC_BODIES = frozenset({("POST", "/v1/jobs"), ("POST", "/v1/plans"), ("POST", "/v1/jobs:batch")})


def _is_spec_body(request: Request, exc: RequestValidationError) -> bool:
    route = (request.method, request.scope.get("path", "").rstrip("/"))
    return route in SPEC_BODIES and all(tuple(e.get("loc", ()))[:1] == ("body",) for e in exc.errors())


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.code, exc.message, fields=exc.fields, details=exc.details,
                              headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        fields = [ErrorField(loc=_loc(tuple(e.get("loc", ()))), message=str(e.get("msg", "")).removeprefix(
            "Value error, ")) for e in exc.errors()]
        summary = "; ".join(f"{f.loc}: {f.message}" for f in fields[:3])
        if _is_spec_body(request, exc):
            return error_response(422, INVALID_SPEC, f"invalid spec: {summary}", fields=fields)
        return error_response(422, "validation_error", f"invalid request: {summary}", fields=fields)

    @app.exception_handler(InvalidSpec)
    async def _invalid_spec(_: Request, exc: InvalidSpec) -> JSONResponse:
        fields = [ErrorField(loc=p.path, message=p.message) for p in exc.problems]
        return error_response(422, INVALID_SPEC, str(exc), fields=fields)

    @app.exception_handler(NotFound)
    async def _not_found(_: Request, exc: NotFound) -> JSONResponse:
        return error_response(404, "not_found", str(exc))

    @app.exception_handler(Conflict)
    async def _conflict(_: Request, exc: Conflict) -> JSONResponse:
        return error_response(409, "conflict", str(exc))

    @app.exception_handler(IllegalTransition)
    async def _transition(_: Request, exc: IllegalTransition) -> JSONResponse:
        return error_response(409, "illegal_transition", str(exc))

    @app.exception_handler(IntegrityError)
    async def _integrity(_: Request, exc: IntegrityError) -> JSONResponse:
        # A unique or foreign key constraint that a concurrent request won first (e.g. two teams of one name).
        return error_response(409, "conflict", "the request conflicts with a concurrent change; read the"
                              f" current state and retry ({type(exc.orig).__name__})")

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        """Whatever nothing else handled, even in middleware, in the error shape: the database out of
        reach is a 503 `database_unavailable` to retry; anything else a 500 `internal_error`."""
        if database_unavailable(exc):
            return error_response(503, "database_unavailable", "the database did not answer (a dropped or refused"
                                  " connection); retry in a moment", headers={"Retry-After": "1"})
        log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return error_response(500, "internal_error", "the server failed to answer this request; it is logged")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _HTTP_CODES.get(exc.status_code, "error")
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405:
            headers["Allow"] = ", ".join(allowed_methods(request))
        return error_response(exc.status_code, code, str(exc.detail), headers=headers or None)


@dataclass(frozen=True, slots=True)
class RouteEntry:
    """One route of the app as a request sees it: its full path template, methods and route object."""

    path: str
    regex: re.Pattern[str]
    methods: frozenset[str]
    route: BaseRoute


def routes_of(app: FastAPI) -> list[RouteEntry]:
    """The app's routes with their full paths, through included routers (which FastAPI keeps nested)."""
    entries = []
    for context in fastapi.routing.iter_route_contexts(app.routes):
        path, route = context.path, context.original_route
        methods = getattr(route, "methods", None)
        if path and methods:
            regex, template, _ = compile_path(path)
            entries.append(RouteEntry(template, regex, frozenset(methods), route))
    return entries


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at this path (Starlette's 405 names only the first route's)."""
    path = request.scope.get("path", "")
    return sorted({m for entry in routes_of(request.app) if entry.regex.match(path) for m in entry.methods})
