"""Build the engine's `Snapshot` from the store, in a few narrow queries.

Waiting jobs are QUEUED jobs that hold no admission (`pool` NULL) of a backend admission manages
(some pool in effect is of that backend, see `service.store.pools`). Running jobs are those that
hold GPUs: admitted (`pool` set) and QUEUED (admitted, not yet leased) or SUBMITTING, PENDING,
RUNNING or CANCELLING. A job admitted before pools existed (`pool` NULL) counts against the
largest pool of its backend and kind. Only id, team, kind, counts and times are read (never a
spec or plan document), so a queue of 10,000 jobs is a few thousand rows of a few columns.

Kueue-managed pools (`kueue: true`) and their jobs are left out: Kueue admits them, so they never
count against another pool or a team's quota here. A waiting job of a backend and GPU kind that a
Kueue pool takes (`kueue_kinds`) is not waiting for the engine (a dispatcher admits it to that pool
when it leases it); a job admitted to a Kueue pool is not running in any pool of the snapshot.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import String, and_, or_, select, type_coerce
from sqlalchemy.orm import Session

from service.lifecycle import HOLDING
from service.scheduling.model import FlavorQuota, Pool, TeamQuota
from service.scheduling.state import RunningJob, Snapshot, WaitingJob
from service.settings import Settings
from service.store.models import Attempt, Job, Team, as_utc, utcnow
from service.store.pools import SourcedPool, effective_pools, kueue_kinds, matching
from service.store.quotas import all_quotas
from service.store.usage import decayed_usage
from service.store.vocab import FailureClass, JobStatus

S = JobStatus


@dataclass(frozen=True, slots=True)
class SnapshotParams:
    """The settings a snapshot carries (`Settings.local_gpus`, `usage_half_life_h`, ...)."""

    local_gpus: str | None = None
    usage_half_life_h: float = 168.0
    usage_blend: float = 0.5
    min_runtime_s: float = 600.0

    @classmethod
    def from_settings(cls, settings: Settings) -> SnapshotParams:
        return cls(local_gpus=settings.local_gpus, usage_half_life_h=settings.usage_half_life_h,
                   usage_blend=settings.usage_blend, min_runtime_s=settings.min_runtime_s)


def _ts(at: datetime | None) -> float | None:
    return None if at is None else as_utc(at).timestamp()


def build_snapshot(session: Session, params: SnapshotParams | None = None, *,
                   now: datetime | None = None) -> Snapshot:
    """Everything one admission decision reads, as the store holds it now."""
    params = params or SnapshotParams()
    now = as_utc(now or utcnow())
    in_effect = effective_pools(session, params.local_gpus)
    # A job of a Kueue pool's backend whose kind no pool has still waits here (no matching pool).
    backends = sorted({p.pool.backend.value for p in in_effect})
    pools = [p for p in in_effect if not p.pool.kueue]
    return Snapshot(now=now.timestamp(), pools=[p.pool for p in pools], quotas=all_quotas(session),
                    default_quota=undeclared_quota(p.pool for p in pools),
                    running=running_jobs(session, pools, now),
                    waiting=waiting_jobs(session, backends, now, skip=kueue_kinds(in_effect)),
                    usage=decayed_usage(session, now=now, half_life_s=params.usage_half_life_h * 3600),
                    usage_blend=params.usage_blend, min_runtime_s=params.min_runtime_s)


def undeclared_quota(pools: Iterable[Pool]) -> TeamQuota:
    """The quota of a team with none declared: it owns nothing and may borrow whatever is free of every
    kind (nominal 0, no borrowing limit), so an installation without quotas admits first come, first
    served up to each pool's size, and declared teams take their nominal quota back from it."""
    return TeamQuota(flavors={kind: FlavorQuota(nominal=0) for kind in sorted({p.gpu for p in pools})})


def waiting_jobs(session: Session, backends: list[str], now: datetime, *,
                 skip: Collection[tuple[str, str]] = ()) -> list[WaitingJob]:
    """QUEUED jobs of the managed `backends` that hold no admission, in admission-key order (priority
    descending, submission time, id), less those whose (backend,
    GPU kind) is in `skip` (the kinds Kueue pools take). Read with a Core query (no ORM rows: a queue
    of 10,000 is one pass over narrow tuples) and built without re-validation: every value comes from
    a checked column."""
    job_table, team_table = Job.__table__, Team.__table__
    jobs, teams = job_table.c, team_table.c
    rows = session.connection().execute(
        select(jobs.id, teams.name, type_coerce(jobs.backend, String), jobs.gpu, jobs.gpus, jobs.priority,
               jobs.created_at, jobs.predicted_s, jobs.not_before)
        .select_from(job_table).join(team_table, teams.id == jobs.team_id)
        .where(jobs.status == S.QUEUED.value, jobs.pool.is_(None), type_coerce(jobs.backend, String).in_(backends))
        .order_by(jobs.priority.desc(), jobs.created_at, jobs.id))
    out = []
    now_ts = now.timestamp()
    for job_id, team, backend, gpu, gpus, priority, created, predicted, not_before in rows:
        if skip and (backend, gpu) in skip:
            continue
        backoff = _ts(not_before)  # a retry waiting out its back-off
        backoff = backoff if backoff is not None and backoff > now_ts else None
        out.append(WaitingJob.model_construct(
            id=job_id, team=team, backend=backend, gpu=gpu, gpus=max(1, gpus), priority=priority,
            submitted_at=as_utc(created).timestamp(), pool=None, predicted_s=predicted, not_before=backoff))
    return out


def running_jobs(session: Session, pools: list[SourcedPool], now: datetime) -> list[RunningJob]:
    """Jobs that hold GPUs of a pool in effect, by id. `remaining_s` is the prediction less the time
    the current attempt has run (None without a prediction)."""
    backends = sorted({p.pool.backend.value for p in pools})
    names = {p.pool.name for p in pools}
    rows = session.execute(
        select(Job.id, Team.name, Job.backend, Job.pool, Job.gpu, Job.gpus, Job.priority, Job.status,
               Job.admitted_at, Job.created_at, Job.predicted_s, Attempt.started_at, Attempt.failure)
        .join(Team, Team.id == Job.team_id)
        .outerjoin(Attempt, and_(Attempt.job_id == Job.id, Attempt.finished_at.is_(None)))
        .where(Job.status.in_(HOLDING), Job.backend.in_(backends),
               or_(Job.pool.is_not(None), Job.status != S.QUEUED))
        .order_by(Job.id))
    out: dict[int, RunningJob] = {}
    for (job_id, team, backend, pool, gpu, gpus, priority, status, admitted, created, predicted,
         started, failure) in rows:
        if pool is None:  # admitted before pools existed: the largest pool of its kind
            fits = matching(pools, str(backend), gpu)
            if not fits:
                continue
            pool = fits[0].name
        elif pool not in names:  # its pool was deleted: it runs on, outside every pool's count
            continue
        started_ts = _ts(started)
        remaining = None
        if predicted is not None:
            remaining = max(0.0, predicted - (now.timestamp() - started_ts if started_ts is not None else 0.0))
        prev = out.get(job_id)
        if prev is not None and (prev.started_at or 0) >= (started_ts or 0):
            continue  # two open attempts (a requeue in flight): the latest start counts
        out[job_id] = RunningJob(id=job_id, team=team, pool=pool, gpu=gpu, gpus=max(1, gpus), priority=priority,
                                 admitted_at=_ts(admitted) or as_utc(created).timestamp(), started_at=started_ts,
                                 remaining_s=remaining,
                                 # being cancelled, or being preempted (its open attempt is marked so)
                                 preemptible=status != S.CANCELLING and failure != FailureClass.PREEMPTED)
    return list(out.values())


__all__ = ["SnapshotParams", "build_snapshot", "running_jobs", "waiting_jobs"]
