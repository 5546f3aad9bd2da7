"""The FastAPI application: `create_app()` wires settings, database, routers, errors and metrics."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from fastapi import FastAPI, Request, Response
from sqlalchemy import Engine

from service.api import errors
from service.api.metrics import make_metrics
from service.api.routers import health, jobs, plans, profiles, teams, tokens
from service.planner.result import Plan
from service.settings import Settings
from service.spec import TrainingSpec
from service.store.db import make_engine, make_sessionmaker


async def _has_nul(request: Request) -> bool:
    """NUL characters anywhere in the path, query or JSON strings (PostgreSQL text cannot store them)."""
    if "\x00" in request.url.path or b"%00" in request.scope.get("query_string", b""):
        return True
    if request.method not in ("POST", "PUT", "PATCH"):
        return False
    body = await request.body()
    if b"\\u0000" not in body and b"\x00" not in body:
        return False
    try:
        return _contains_nul(json.loads(body))
    except ValueError:
        return b"\x00" in body


def _contains_nul(value: object) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_contains_nul(k) or _contains_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_contains_nul(v) for v in value)
    return False


_PROFILES_PATH = re.compile(r"/v1/jobs/[^/]+/profiles/?")


def _traces_posted_to_profiles(request: Request) -> bool:
    """Trace files (multipart) posted to `/profiles` rather than to `/profiles/traces`."""
    content_type = request.headers.get("content-type", "").lower()
    return (request.method == "POST" and content_type.startswith("multipart/form-data")
            and _PROFILES_PATH.fullmatch(request.scope["path"]) is not None)


LaunchPreview = Callable[[TrainingSpec, Plan], dict[str, Any] | None]


def create_app(settings: Settings | None = None, *, engine: Engine | None = None,
               launch_preview: LaunchPreview | None = None,
               configured_backends: Collection[str] | None = None) -> FastAPI:
    """An app on `settings.database_url` (or `engine`). The schema must be migrated already
    (`shardctl db upgrade`; `shardctl serve` does it). `launch_preview(spec, plan)` renders what a
    backend would be sent; `configured_backends` are the backend kinds the dispatchers run, and a
    spec for another is a 422 at submit (None: not checked). The composition module
    (`service.cli.wiring`) passes both; the API never imports workers."""
    settings = settings or Settings()
    engine = engine or make_engine(settings.resolved_database_url)
    app = FastAPI(title="shardctl", version="0.1.0",
                  description="Plan, launch and track distributed training jobs.")
    app.state.settings = settings
    app.state.engine = engine
    app.state.sessions = make_sessionmaker(engine)
    app.state.metrics = make_metrics(app.state.sessions)
    app.state.launch_preview = launch_preview
    app.state.configured_backends = frozenset(configured_backends) if configured_backends is not None else None
    errors.install(app)
    for module in (health, plans, jobs, profiles, teams, tokens):
        app.include_router(module.router)

    @app.middleware("http")
    async def _limits_and_latency(request: Request,
                                  call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if _traces_posted_to_profiles(request):
            # One address for both kinds of profile: a summary (JSON) or the trace files themselves.
            request.scope["path"] = request.scope["path"].rstrip("/") + "/traces"
        length = request.headers.get("content-length")
        uploading = request.scope["path"].endswith("/profiles/traces")  # that route limits each file
        limit = settings.max_trace_bytes * profiles.MAX_FILES if uploading else settings.max_body_bytes
        if length is not None and (not length.isdigit() or int(length) > limit):
            return errors.error_response(413, "too_large", f"request body over {limit} bytes")
        if not uploading and await _has_nul(request):
            return errors.error_response(422, "validation_error", "NUL characters are not allowed in requests")
        start = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        path = getattr(route, "path", "unmatched")
        app.state.metrics.latency.labels(method=request.method, route=path,
                                         status=str(response.status_code)).observe(time.perf_counter() - start)
        return response

    return app
