from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from fastapi.security import HTTPAuthorizationCredentials
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import text

from service.api.deps import Db, bearer
from service.api.errors import ApiError
from service.api.metrics import authorize_scrape, exposition

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="The process is up")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", summary="The database answers")
def readyz(db: Db) -> dict[str, str]:
    try:
        with db.begin() as session:
            session.execute(text("SELECT 1"))
    except Exception as exc:
        raise ApiError(503, "unavailable", f"database unreachable: {type(exc).__name__}") from exc
    return {"status": "ready"}


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
def metrics(request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> Response:
    """Open unless SHARDCTL_METRICS_TOKEN is set (then that token or an admin token); series name no team
    unless SHARDCTL_METRICS_TEAM_LABELS is true."""
    settings = request.app.state.settings
    authorize_scrape(settings, request.app.state.sessions, credentials.credentials if credentials else None)
    return Response(exposition(request.app.state.metrics, team_labels=settings.metrics_team_labels),
                    media_type=CONTENT_TYPE_LATEST)
