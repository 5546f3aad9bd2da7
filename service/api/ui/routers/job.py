"""The Job page (`/ui/jobs/{id}`): one job, as `GET /v1/jobs/{id}` shows it to the session's token.

A job the session may not see is a 404 page, in the API's words (`visible_job` raises `NotFound`).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request
from starlette.responses import Response

from service.api.deps import Db
from service.api.routers.jobs import get_job
from service.api.ui.render import page
from service.api.ui.session import Signed

router = APIRouter(tags=["ui"], include_in_schema=False)
JobId = Annotated[int, Path(ge=1, le=2**63 - 1)]


@router.get("/ui/jobs/{job_id}")
def job_page(job_id: JobId, request: Request, session: Signed, db: Db) -> Response:
    job = get_job(job_id, session.principal, db)
    return page(request, session, "job.html", title=f"Job {job.id}: {job.name}", job=job)
