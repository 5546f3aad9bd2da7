"""Team quotas, usage and "why is my job pending":

- `PUT /v1/teams/{team}/quota` (admin), `GET /v1/teams/{team}/quota` (admins; members their own team)
- `GET /v1/teams/{team}/usage?since=`: GPU-seconds per kind since then, GPUs admitted and borrowed
  now, waiting demand
- `GET /v1/jobs/{id}/explain`: the engine's explanation for a waiting job (same visibility as
  `GET /v1/jobs/{id}`), from the dispatcher's queue view while it is fresh (`as_of` says when it was
  computed; `service.store.queue_view`), else computed for the request; for a job that does not
  wait for admission, what it does instead, and for one its backend holds (PENDING or SUBMITTING),
  the backend's own reason and start estimate

A team another member's token cannot see is a 404 with the words of a missing team.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response
from pydantic import BaseModel, Field
from sqlalchemy.orm import Session

from service.api.deps import Admin, Caller, Db, Person
from service.api.errors import ApiError
from service.api.schemas import ErrorField, ErrorResponse
from service.lifecycle import AT_BACKEND_WAITING, TERMINAL, UNSUBMITTED
from service.names import Label
from service.scheduling import engine
from service.scheduling.decisions import Eta, Explanation, Reason, ReasonCode
from service.scheduling.model import TeamQuota
from service.scheduling.snapshot import SnapshotParams, build_snapshot, running_jobs, waiting_jobs
from service.store.backend_pending import last_backend_pending
from service.store.jobs import visible_job
from service.store.models import Job, Team, as_utc, utcnow
from service.store.pools import effective_pools, kueue_kinds, managed
from service.store.queue_view import read_explanation
from service.store.quotas import get_quota, put_quota
from service.store.tokens import NotFound, Principal, ensure_team, team_by_name
from service.store.usage import gpu_seconds
from service.store.visibility import may_see_team, sees_every_team
from service.store.vocab import JobStatus

router = APIRouter(tags=["scheduling"])
ERRORS: dict[int | str, dict[str, object]] = {404: {"model": ErrorResponse}, 422: {"model": ErrorResponse}}
TeamName = Annotated[Label, Path(min_length=1, max_length=63, description="The team's name (a DNS label).")]
JobId = Annotated[int, Path(ge=1, le=2**63 - 1, description="The job's id.")]
DEFAULT_USAGE_WINDOW = timedelta(days=7)


class QuotaOut(BaseModel):
    team: str
    declared: bool = Field(description="False: the team has no quota declared; `quota` shows what applies"
                           " (nothing owned, it borrows what is free; max_priority the default).")
    quota: TeamQuota


class UsageOut(BaseModel):
    team: str
    since: datetime
    now: datetime
    gpu_seconds: dict[str, float] = Field(description="Per GPU kind, GPU-seconds used in [since, now].")
    admitted: dict[str, int] = Field(description="Per GPU kind, GPUs its admitted jobs hold now.")
    borrowed: dict[str, int] = Field(description="Per GPU kind, of those, GPUs above its nominal quota.")
    waiting: dict[str, dict[str, int]] = Field(description='Per GPU kind, {"jobs": n, "gpus": n} waiting.')


def _team(session: Session, principal: Principal, name: str) -> Team:
    """The team, if the caller may see it (admins any, members their own); else `NotFound`."""
    try:
        team = team_by_name(session, name)
    except NotFound:
        raise NotFound(f"no team named {name!r}") from None
    if not may_see_team(principal, team.id):
        raise NotFound(f"no team named {name!r}")
    return team


@router.put("/v1/teams/{team}/quota", response_model=QuotaOut, responses=ERRORS,
            summary="Declare or replace a team's quota (admin)")
def put_team_quota(team: TeamName, body: TeamQuota, principal: Admin, db: Db, request: Request) -> QuotaOut:
    """Every GPU kind named in `flavors` must be the kind of some pool in effect (a quota for hardware no
    pool has is a typo): else a 422 naming the kinds that exist. A team not yet known is created, so
    quotas can be declared before the team's first member or job."""
    with db.begin() as session:
        row = ensure_team(session, team)
        kinds = sorted({p.pool.gpu for p in effective_pools(session, request.app.state.settings.local_gpus)})
        for flavor in body.flavors:
            if flavor not in kinds:
                message = (f"no pool has GPU kind {flavor!r}; use one of {', '.join(kinds)} or declare a pool of"
                           " that kind first (PUT /v1/pools/{name})")
                raise ApiError(422, "validation_error", message,
                               fields=[ErrorField(loc=f"flavors.{flavor}", message=message)])
        put_quota(session, row, body)
        return QuotaOut(team=row.name, declared=True, quota=body)


@router.get("/v1/teams/{team}/quota", response_model=QuotaOut, responses=ERRORS,
            summary="A team's quota (admins; members their own team)")
def get_team_quota(team: TeamName, principal: Person, db: Db) -> QuotaOut:
    with db.begin() as session:
        row = _team(session, principal, team)
        quota = get_quota(session, row)
        return QuotaOut(team=row.name, declared=quota is not None, quota=quota or TeamQuota())


@router.get("/v1/teams/{team}/usage", response_model=UsageOut, responses=ERRORS,
            summary="GPU-seconds since a time, GPUs admitted and borrowed now, waiting demand")
def get_team_usage(team: TeamName, principal: Person, db: Db, request: Request,
                   since: Annotated[datetime | None, Query(description="ISO 8601; default: 7 days ago. A time"
                                                           " without offset is UTC.")] = None) -> UsageOut:
    now = utcnow()
    start = as_utc(since) if since is not None else now - DEFAULT_USAGE_WINDOW
    if start > now:
        raise ApiError(422, "validation_error", "since is in the future; give a time before now",
                       fields=[ErrorField(loc="since", message="must be before now")])
    with db.begin() as session:
        row = _team(session, principal, team)
        used = gpu_seconds(session, since=start, now=now, team_id=row.id).get(row.name, {})
        pools = effective_pools(session, request.app.state.settings.local_gpus)
        admitted: dict[str, int] = defaultdict(int)
        for r in running_jobs(session, pools, now):
            if r.team == row.name:
                admitted[r.gpu] += r.gpus
        quota = get_quota(session, row) or TeamQuota()
        borrowed = {k: max(0, n - (quota.flavors[k].nominal if k in quota.flavors else 0))
                    for k, n in admitted.items()}
        waiting: dict[str, dict[str, int]] = defaultdict(lambda: {"jobs": 0, "gpus": 0})
        for w in waiting_jobs(session, sorted({p.pool.backend.value for p in pools}), now):
            if w.team == row.name:
                waiting[w.gpu]["jobs"] += 1
                waiting[w.gpu]["gpus"] += w.gpus
        return UsageOut(team=row.name, since=start, now=now, gpu_seconds={k: round(v, 3) for k, v in used.items()},
                        admitted=dict(admitted), borrowed=borrowed, waiting=dict(waiting))


S = JobStatus


def _not_waiting(job: Job, pools_managed: bool) -> Explanation | None:
    """The explanation of a job that does not wait for admission; None for one that does."""
    status = job.status.value
    if job.status in TERMINAL:
        return Explanation(status=status, admitted=job.admitted_at is not None, pool=job.pool,
                           note=f"job {job.id} has ended ({status}); it no longer waits")
    if not pools_managed:
        return Explanation(status=status, admitted=True, note=f"backend {job.backend.value!r} has no pool declared,"
                           " so shardctl does not hold its jobs back: the backend's own scheduler queues them")
    if job.status == S.QUEUED and job.pool is None:
        return None
    where = f" in pool {job.pool}" if job.pool else ""
    if job.status == S.RUNNING:
        return Explanation(status=status, admitted=True, pool=job.pool, note=f"job {job.id} is running{where}")
    if job.status == S.CANCELLING:
        return Explanation(status=status, admitted=True, pool=job.pool, note=f"job {job.id} is being cancelled")
    if job.status in UNSUBMITTED:
        return Explanation(status=status, admitted=True, pool=job.pool,
                           note=f"job {job.id} is admitted{where}; a dispatcher is submitting it to its backend")
    reason = Reason(code=ReasonCode.BACKEND_PENDING, message=f"admitted{where}; waiting for the {job.backend.value}"
                    " backend to start it", flavor=job.gpu, requested=job.gpus)
    return Explanation(status=status, admitted=True, pool=job.pool, reasons=[reason],
                       note=f"job {job.id} is admitted{where} and handed to its backend")


#: How explain names each backend, and whose start estimate it quotes.
BACKEND_WORDS = {"slurm": "Slurm", "kubernetes": "Kubernetes", "local": "the local backend"}
ESTIMATE_WORDS = {"slurm": "Slurm's own `squeue --start` estimate"}


def _backend_pending(session: Session, job: Job, base: Explanation, pools_managed: bool) -> Explanation:
    """`base` (a PENDING or SUBMITTING job's explanation) with the backend's own reason for holding
    the current attempt, when the dispatcher recorded one (`job.backend_pending`): one
    `backend_pending` reason quoting the backend, and an `eta` that puts shardctl's own band (0: it
    is admitted, shardctl holds nothing back; none when shardctl does not queue this backend) next
    to the backend's estimate (`backend_start_s`, seconds from now). `base` unchanged otherwise."""
    if job.status not in AT_BACKEND_WAITING or not job.attempts:
        return base
    last = last_backend_pending(session, job.id, job.attempts[-1].number)
    if last is None or (last.reason is None and last.expected_start is None):
        return base
    backend = job.backend.value
    who = BACKEND_WORDS.get(backend, backend)
    where = f" to pool {job.pool}" if job.pool else ""
    reason = Reason(code=ReasonCode.BACKEND_PENDING, flavor=job.gpu, requested=job.gpus,
                    message=f"admitted{where}; {who} holds it: {last.reason or 'it gives no reason'}")
    now = utcnow().timestamp()
    start_s = None if last.expected_start is None else round(max(0.0, last.expected_start - now), 1)
    estimate = ESTIMATE_WORDS.get(backend, f"{who}'s own estimate")
    method = (f"{estimate}: {start_s:g} s from now" if start_s is not None
              else f"{who} gives no start estimate")
    if pools_managed:
        eta = Eta(earliest_s=0.0, latest_s=0.0, backend_start_s=start_s,
                  method=f"shardctl: already admitted{where}, nothing of its own holds it back; {method}")
    else:
        eta = Eta(earliest_s=None, latest_s=None, backend_start_s=start_s,
                  method=f"shardctl: no band, it does not queue {backend} jobs (no pool declared); {method}")
    return base.model_copy(update={"reasons": [reason], "eta": eta})


@router.get("/v1/jobs/{job_id}/explain", response_model=Explanation, responses=ERRORS,
            summary="Why a job waits: reasons, position, who is ahead, an ETA band")
def explain_job(job_id: JobId, principal: Caller, db: Db, request: Request) -> Response:
    """Same visibility as `GET /v1/jobs/{id}`. Jobs ahead from the caller's own team are listed;
    other teams' are counted and summed, never named (an admin sees every one)."""
    settings = request.app.state.settings
    with db.begin() as session:
        job = visible_job(session, principal, job_id)
        params = SnapshotParams.from_settings(settings)
        pools = effective_pools(session, params.local_gpus)
        pools_managed = managed(pools, job.backend.value)
        done = _not_waiting(job, pools_managed)
        kueue_pool = kueue_kinds(pools).get((job.backend.value, job.gpu))
        if done is None and kueue_pool is not None:  # Kueue admits it, not shardctl's engine
            done = Explanation(status=job.status.value, admitted=False, pool=kueue_pool,
                               note=f"pool {kueue_pool} is managed by Kueue: the next dispatcher cycle hands job"
                               f" {job.id} to it, and Kueue admits it (see the workload's conditions)")
        if done is not None:
            done = _backend_pending(session, job, done, pools_managed)
        else:
            viewer = None if sees_every_team(principal) else job.team.name
            done = read_explanation(session, job_id, viewer, now=utcnow(), max_age_s=settings.queue_view_max_age_s,
                                    changed_at=job.updated_at) if job.status == S.QUEUED else None
            if done is None:  # no fresh view, or the job is not in it (submitted or requeued since): live
                try:
                    done = engine.explain(build_snapshot(session, params), job_id, viewer)
                except engine.UnknownJob as exc:
                    raise NotFound(f"no job {job_id}") from exc
            done = done.model_copy(update={"status": job.status.value})
    return Response(done.model_dump_json(), media_type="application/json")
