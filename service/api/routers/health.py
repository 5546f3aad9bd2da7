from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from service.api.deps import Db
from service.api.errors import ApiError

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
def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
