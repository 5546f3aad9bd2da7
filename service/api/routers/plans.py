from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from service.api.deps import Db, Person
from service.api.errors import ApiError
from service.api.schemas import ErrorField, ErrorResponse
from service.api.submission import preview
from service.planner import Plan
from service.spec import TrainingSpec

router = APIRouter(prefix="/v1/plans", tags=["plans"])


class Verdict(BaseModel):
    """What `POST /v1/jobs` would answer for the same spec, now."""

    submittable: bool = Field(description="It would queue the job.")
    status: int | None = Field(None, description="The HTTP status it would refuse the job with; null when it"
                               " would queue it.")
    code: str | None = Field(None, description="The error code it would answer (does_not_fit,"
                             " needs_runtime_support, invalid_spec, not_found, priority_over_limit...).")
    message: str | None = Field(None, description="Its message, naming the fix.")
    fields: list[ErrorField] = Field(default_factory=list, description="The spec fields at fault.")


class PlanPreview(Plan):
    launch: dict[str, Any] | None = Field(
        None, description="What the backend would be sent for attempt 1 (sbatch script, Kubernetes objects,"
        " torchrun commands); null when this server runs no dispatcher for the spec's backend, or the job"
        " would be refused.")
    verdict: Verdict = Field(description="What submitting this spec would answer: the same checks, on this plan.")


@router.post("", response_model=PlanPreview, summary="Dry run: plan a spec without creating a job",
             responses={403: {"model": ErrorResponse}, 422: {"model": ErrorResponse},
                        503: {"model": ErrorResponse}})
def create_plan(spec: TrainingSpec, principal: Person, db: Db, request: Request) -> PlanPreview:
    """The dry run (`service.api.submission.preview`): the plan `POST /v1/jobs` would make for this
    caller, calibrated for its team, with `verdict`, what that submission would answer, and the
    rendered launch request. No job is created. Raises what `POST /v1/jobs` raises before it has a
    plan: 422 `invalid_spec` when the spec breaks the contract or names a backend this server does not
    run; 403 when a member names another team; 422 `plan_too_costly` when the search runs past the
    server's planner budget (pin more of the layout); 503 `planner_busy` with Retry-After when every
    planning thread is busy."""
    state = request.app.state
    dry = preview(db, principal, spec, state.configured_backends, state.planner, local_gpus=state.settings.local_gpus)
    result, refused = dry.plan, dry.refused
    verdict = Verdict(submittable=True) if refused is None else Verdict(
        submittable=False, status=refused.status, code=refused.code, message=refused.message, fields=refused.fields)
    launch = None
    if state.launch_preview is not None and refused is None:
        try:
            launch = state.launch_preview(spec, result)
        except ValueError as exc:  # the backend cannot render this spec (e.g. no image for Kubernetes)
            raise ApiError(422, "cannot_render", f"{spec.backend.kind}: {exc}") from exc
    return PlanPreview(**result.model_dump(), launch=launch, verdict=verdict)
