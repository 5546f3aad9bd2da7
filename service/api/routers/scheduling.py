"""Team quotas, usage and "why is my job pending":

- `PUT /v1/teams/{team}/quota` (admin), `GET /v1/teams/{team}/quota` (admins; members their own team)
- `GET /v1/teams/{team}/usage?since=`: GPU-seconds per kind since then, GPUs admitted and borrowed
  now, waiting demand
- `GET /v1/jobs/{id}/explain`: the engine's explanation for a waiting job (same visibility as
  `GET /v1/jobs/{id}`), from the dispatcher's queue view while it is fresh (`as_of` says when it was
  computed; `service.store.queue_view`), else computed for the request; for a job that does not
  wait for admission, what it does instead, and for one its backend holds (PENDING or SUBMITTING),
  the backend's own reason and start estimate

A team another member's token cannot see is a 404 with the words of a missing team. The routes read
the request and call the service layer: `service.api.ops.teams` (quota, usage) and
`service.api.ops.explain`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response

from service.api.deps import Admin, Caller, Db, Person
from service.api.ops.explain import explain_job as explanation
from service.api.ops.teams import QuotaOut, UsageOut, declare_quota, team_quota, team_usage
from service.api.schemas import ErrorResponse
from service.names import Label
from service.scheduling.decisions import Explanation
from service.scheduling.model import TeamQuota
from service.scheduling.snapshot import SnapshotParams

router = APIRouter(tags=["scheduling"])
ERRORS: dict[int | str, dict[str, object]] = {404: {"model": ErrorResponse}, 422: {"model": ErrorResponse}}
TeamName = Annotated[Label, Path(min_length=1, max_length=63, description="The team's name (a DNS label).")]
JobId = Annotated[int, Path(ge=1, le=2**63 - 1, description="The job's id.")]


@router.put("/v1/teams/{team}/quota", response_model=QuotaOut, responses=ERRORS,
            summary="Declare or replace a team's quota (admin)")
def put_team_quota(team: TeamName, body: TeamQuota, principal: Admin, db: Db, request: Request) -> QuotaOut:
    """Every GPU kind named in `flavors` must be the kind of some pool in effect (a quota for hardware no
    pool has is a typo): else a 422 naming the kinds that exist. A team not yet known is created, so
    quotas can be declared before the team's first member or job."""
    return declare_quota(db, principal, team, body, local_gpus=request.app.state.settings.local_gpus)


@router.get("/v1/teams/{team}/quota", response_model=QuotaOut, responses=ERRORS,
            summary="A team's quota (admins; members their own team)")
def get_team_quota(team: TeamName, principal: Person, db: Db) -> QuotaOut:
    return team_quota(db, principal, team)


@router.get("/v1/teams/{team}/usage", response_model=UsageOut, responses=ERRORS,
            summary="GPU-seconds since a time, GPUs admitted and borrowed now, waiting demand")
def get_team_usage(team: TeamName, principal: Person, db: Db, request: Request,
                   since: Annotated[datetime | None, Query(description="ISO 8601; default: 7 days ago. A time"
                                                           " without offset is UTC.")] = None) -> UsageOut:
    return team_usage(db, principal, team, since, local_gpus=request.app.state.settings.local_gpus)


@router.get("/v1/jobs/{job_id}/explain", response_model=Explanation, responses=ERRORS,
            summary="Why a job waits: reasons, position, who is ahead, an ETA band")
def explain_job(job_id: JobId, principal: Caller, db: Db, request: Request) -> Response:
    """Same visibility as `GET /v1/jobs/{id}`. Jobs ahead from the caller's own team are listed;
    other teams' are counted and summed, never named (an admin sees every one)."""
    settings = request.app.state.settings
    done = explanation(db, principal, job_id, SnapshotParams.from_settings(settings),
                       max_age_s=settings.queue_view_max_age_s)
    return Response(done.model_dump_json(), media_type="application/json")
