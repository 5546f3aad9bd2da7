from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import Field

from service.api.deps import Person
from service.api.errors import ApiError
from service.api.schemas import ErrorResponse
from service.api.submission import cached_plan, check_backend, team_of
from service.planner import Plan
from service.spec import TrainingSpec

router = APIRouter(prefix="/v1/plans", tags=["plans"])


class PlanPreview(Plan):
    launch: dict[str, Any] | None = Field(
        None, description="What the backend would be sent for attempt 1 (sbatch script, Kubernetes objects,"
        " torchrun commands); null when this server runs no dispatcher for the spec's backend.")


@router.post("", response_model=PlanPreview, summary="Dry run: plan a spec without creating a job",
             responses={422: {"model": ErrorResponse}, 503: {"model": ErrorResponse}})
def create_plan(spec: TrainingSpec, principal: Person, request: Request) -> PlanPreview:
    """The planner's `Plan`, fitting or not (`fits` says which), with the rendered launch request,
    calibrated as a job of the team it would be submitted into. No job is created. 422 `invalid_spec`
    when the spec breaks the contract or names a backend this server does not run; 422
    `plan_too_costly` when the search runs past the server's planner budget (pin more of the layout);
    503 `planner_busy` with Retry-After when every planning thread is busy."""
    check_backend(spec, request.app.state.configured_backends)
    result = cached_plan(spec, request.app.state.planner, team_of(principal, spec))
    preview = request.app.state.launch_preview
    launch = None
    if preview is not None and result.fits:
        try:
            launch = preview(spec, result)
        except ValueError as exc:  # the backend cannot render this spec (e.g. no image for Kubernetes)
            raise ApiError(422, "cannot_render", f"{spec.backend.kind}: {exc}") from exc
    return PlanPreview(**result.model_dump(), launch=launch)

