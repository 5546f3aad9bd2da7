"""A team's quota and usage: what `PUT/GET /v1/teams/{team}/quota` and `GET /v1/teams/{team}/usage`
answer, and what the dashboard's Teams and Admin pages show and save.

A team the caller may not see (a member asking about another team) is `NotFound` in the words of a
missing team, so its existence does not leak.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

from pydantic import BaseModel, Field
from sqlalchemy.orm import Session, sessionmaker

from service.api.errors import ApiError
from service.api.ops.access import admin_only
from service.api.schemas import ErrorField
from service.scheduling.model import TeamQuota
from service.scheduling.snapshot import running_jobs, waiting_jobs
from service.store.models import Team, as_utc, utcnow
from service.store.pools import effective_pools
from service.store.quotas import get_quota, put_quota
from service.store.tokens import NotFound, Principal, ensure_team, team_by_name
from service.store.usage import gpu_seconds
from service.store.visibility import may_see_team

#: The usage window when no `since` is given.
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


def visible_team(session: Session, principal: Principal, name: str) -> Team:
    """The team, if the caller may see it (admins any, members their own); else `NotFound`."""
    try:
        team = team_by_name(session, name)
    except NotFound:
        raise NotFound(f"no team named {name!r}") from None
    if not may_see_team(principal, team.id):
        raise NotFound(f"no team named {name!r}")
    return team


def declare_quota(db: sessionmaker[Session], principal: Principal, team: str, quota: TeamQuota, *,
                  local_gpus: str | None) -> QuotaOut:
    """Declare or replace team `team`'s quota (admins only: a 403 otherwise). Every GPU kind named in
    `quota.flavors` must be the kind of some pool in effect (a quota for hardware no pool has is a
    typo): else a 422 naming the kinds that exist. A team not yet known is created, so quotas can be
    declared before the team's first member or job."""
    admin_only(principal)
    with db.begin() as session:
        row = ensure_team(session, team)
        kinds = sorted({p.pool.gpu for p in effective_pools(session, local_gpus)})
        for flavor in quota.flavors:
            if flavor not in kinds:
                message = (f"no pool has GPU kind {flavor!r}; use one of {', '.join(kinds)} or declare a pool of"
                           " that kind first (PUT /v1/pools/{name})")
                raise ApiError(422, "validation_error", message,
                               fields=[ErrorField(loc=f"flavors.{flavor}", message=message)])
        put_quota(session, row, quota)
        return QuotaOut(team=row.name, declared=True, quota=quota)


def team_quota(db: sessionmaker[Session], principal: Principal, team: str) -> QuotaOut:
    """Team `team`'s quota as declared, or what applies when none is (`declared` false)."""
    with db.begin() as session:
        row = visible_team(session, principal, team)
        quota = get_quota(session, row)
        return QuotaOut(team=row.name, declared=quota is not None, quota=quota or TeamQuota())


def team_usage(db: sessionmaker[Session], principal: Principal, team: str, since: datetime | None, *,
               local_gpus: str | None) -> UsageOut:
    """Team `team`'s GPU-seconds per kind since `since` (None: `DEFAULT_USAGE_WINDOW` ago; a time
    without offset is UTC; a 422 when it is in the future), the GPUs its admitted jobs hold now and,
    of those, what is above its nominal quota, and what waits."""
    now = utcnow()
    start = as_utc(since) if since is not None else now - DEFAULT_USAGE_WINDOW
    if start > now:
        raise ApiError(422, "validation_error", "since is in the future; give a time before now",
                       fields=[ErrorField(loc="since", message="must be before now")])
    with db.begin() as session:
        row = visible_team(session, principal, team)
        used = gpu_seconds(session, since=start, now=now, team_id=row.id).get(row.name, {})
        pools = effective_pools(session, local_gpus)
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
