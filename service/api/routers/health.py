from __future__ import annotations

import logging
import os
from functools import lru_cache
from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from fastapi.security import HTTPAuthorizationCredentials
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import inspect, text
from sqlalchemy.orm import Session, sessionmaker

from service.api.deps import Db, bearer
from service.api.errors import ApiError
from service.api.metrics import authorize_scrape, exposition

router = APIRouter(tags=["health"])
Sessions = sessionmaker[Session]
log = logging.getLogger("shardctl.api")


#: The header `/healthz` names the answering process in (tells apart the workers of `serve --workers N`).
PID_HEADER = "X-Shardctl-Pid"


@router.get("/healthz", summary="The process is up", responses={200: {"headers": {PID_HEADER: {
    "description": "The id of the process that answered.", "schema": {"type": "integer"}}}}})
def healthz(response: Response) -> dict[str, str]:
    """Always 200 while the process serves."""
    response.headers[PID_HEADER] = str(os.getpid())
    return {"status": "ok"}


@lru_cache(maxsize=1)
def code_head() -> str | None:
    """The newest migration this code ships (`migrations/`, as `shardctl db upgrade` applies it)."""
    from alembic.script import ScriptDirectory

    from service.store.migrate import alembic_config

    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def _known(revision: str) -> bool:
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    from service.store.migrate import alembic_config

    try:
        return ScriptDirectory.from_config(alembic_config("sqlite://")).get_revision(revision) is not None
    except CommandError:
        return False


def _database_revision(db: Sessions) -> str | None:
    """The database's Alembic revision (None before the first migration); raises when it does not answer."""
    with db.begin() as session:
        session.execute(text("SELECT 1"))
        if not inspect(session.connection()).has_table("alembic_version"):
            return None
        revision = session.scalar(text("SELECT version_num FROM alembic_version"))
        return str(revision) if revision is not None else None


@router.get("/readyz", summary="The database answers and its schema is this version's")
def readyz(db: Db) -> dict[str, str]:
    """200 when the database answers and is at this code's migration head; else 503 naming the cause:
    the database does not answer, or its revision is not this code's (`shardctl db upgrade`)."""
    try:
        revision = _database_revision(db)
    except Exception as exc:  # the details (host, driver message) go to the server's log, not to anyone asking
        log.warning("readiness: the database did not answer: %s", (str(exc).strip().splitlines() or [""])[0][:500])
        raise ApiError(503, "unavailable", f"database unreachable ({type(exc).__name__}); the server's log has"
                       " the driver's message") from exc
    head = code_head()
    if revision != head:
        if revision is not None and not _known(revision):
            raise ApiError(503, "unavailable", f"the database is at revision {revision}, which this version does not"
                           f" know (it expects {head}): a newer shardctl migrated it; run that version")
        raise ApiError(503, "unavailable", f"migrations pending: the database is at revision {revision or 'none'},"
                       f" this version expects {head}; run `shardctl db upgrade` (serve and worker also do at start)")
    return {"status": "ready"}


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
def metrics(request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> Response:
    """Open unless SHARDCTL_METRICS_TOKEN is set (then that token or an admin token); series name no team
    unless SHARDCTL_METRICS_TEAM_LABELS is true."""
    settings = request.app.state.settings
    authorize_scrape(settings, request.app.state.sessions, credentials.credentials if credentials else None)
    return Response(exposition(request.app.state.metrics, team_labels=settings.metrics_team_labels),
                    media_type=CONTENT_TYPE_LATEST)
