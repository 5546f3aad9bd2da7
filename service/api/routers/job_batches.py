"""`POST /v1/jobs:batch`: plan and queue up to `MAX_BATCH` specs in one request and one transaction."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Request, Response
from pydantic import BaseModel, Field

from service.api.deps import Db, Person
from service.api.errors import ApiError
from service.api.schemas import ErrorField, ErrorResponse, JobSummary
from service.api.submission import MAX_BATCH, submit_batch
from service.api.views import encoded
from service.spec import TrainingSpec

# `jobs:batch`, a custom method on the collection (as Google's API guide names them): `/v1/jobs/batch`
# would share its path with GET /v1/jobs/{job_id}.
router = APIRouter(tags=["jobs"])


class BatchIn(BaseModel):
    """The specs to queue, all or none."""

    specs: list[TrainingSpec] = Field(min_length=1, max_length=MAX_BATCH,
                                      description=f"1 to {MAX_BATCH} training specs, as `POST /v1/jobs` takes one.")


class BatchOut(BaseModel):
    items: list[JobSummary] = Field(description="The queued jobs, in the order of `specs`; read one with"
                                    " GET /v1/jobs/{id} for its spec and plan.")


@router.post("/v1/jobs:batch", response_model=BatchOut, status_code=201,
             responses={403: {"model": ErrorResponse}, 404: {"model": ErrorResponse},
                        422: {"model": ErrorResponse}, 503: {"model": ErrorResponse}},
             summary="Plan and queue several jobs at once, all or none")
def create_jobs(body: BatchIn, principal: Person, db: Db, request: Request,
                idempotency_key: Annotated[str | None, Header(include_in_schema=False)] = None) -> Response:
    """201 with a summary of every new job, in order. Each spec gets the checks `POST /v1/jobs` makes
    (team, priority limit, backend, planning, pools); when any is refused, none is stored and the
    error names each refused item by index (`details.items`, fields `specs.<i>.<field>`). The jobs,
    their events and webhook deliveries commit in one transaction before the answer."""
    if idempotency_key is not None:
        message = ("a batch takes no Idempotency-Key (it names one job); send each spec to POST /v1/jobs with"
                   " its own key, or send the batch without one")
        raise ApiError(400, "bad_request", message, fields=[ErrorField(loc="header.Idempotency-Key", message=message)])
    state = request.app.state
    items = submit_batch(db, principal, body.specs, state.configured_backends, state.planner,
                         local_gpus=state.settings.local_gpus)
    out = BatchOut.model_construct(items=items)
    for item in items:
        state.metrics.submissions.labels(team=item.team).inc()
    return Response(encoded(out), status_code=201, media_type="application/json")
