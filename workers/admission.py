"""Admission in the dispatcher: which queued jobs are leased for submission this cycle.

In one transaction (`lease`):

1. **Held jobs** are leased first, as before admission existed: SUBMITTING jobs whose lease ran
   out (a dispatcher died mid-submission), QUEUED jobs admitted in an earlier cycle but not yet
   leased (`pool` set), and QUEUED jobs of a backend admission does not manage (no pool of it is
   in effect: Slurm or Kubernetes without declared pools; their own scheduler queues them). They
   keep their admission; highest priority first, then id.
2. **Kueue pools**: QUEUED jobs of a backend and GPU kind a Kueue-managed pool takes
   (`service.store.pools.kueue_kinds`) are not gated here: each gets that pool and `admitted_at`
   written and is leased at once (highest priority first, then id, as the batch has room), like a job
   of an unmanaged backend; Kueue admits its workload. A retry waiting out its back-off waits.
3. **Admission**: a `Snapshot` of the store (`service.scheduling.snapshot`) goes to
   `service.scheduling.engine.admit`; each admitted job gets its `pool` and `admitted_at` written
   (it holds its GPUs from now on), and as many as the batch has room for are leased, in the
   engine's admission order. The same store gives the same decisions.

Replicas: on PostgreSQL, admission runs under a transaction-scoped advisory lock
(`pg_try_advisory_xact_lock`); a dispatcher that does not get it leases held jobs only this cycle,
so two dispatchers never admit against the same free capacity. SQLite's `BEGIN IMMEDIATE`
serialises every transaction already.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, and_, false, not_, or_, select, text, update
from sqlalchemy.orm import Session

from service.lifecycle import UNSUBMITTED
from service.scheduling import engine
from service.scheduling.decisions import Decision
from service.scheduling.snapshot import SnapshotParams, build_snapshot
from service.store.models import Job
from service.store.pools import effective_pools, kueue_kinds
from service.store.vocab import JobStatus

S = JobStatus
#: the advisory lock key admission takes on PostgreSQL ("shardadm" as 8 bytes)
ADMISSION_LOCK_KEY = int.from_bytes(b"shardadm", "big") & 0x7FFF_FFFF_FFFF_FFFF


@dataclass
class LeaseResult:
    """The ids leased, in order (held first, then admitted in admission order), and the decision."""

    ids: list[int] = field(default_factory=list)
    decision: Decision | None = None


def _try_lock(session: Session) -> bool:
    if session.get_bind().dialect.name != "postgresql":
        return True
    return bool(session.execute(text("SELECT pg_try_advisory_xact_lock(:key)"), {"key": ADMISSION_LOCK_KEY}).scalar())


def _of_kinds(kinds: dict[tuple[str, str], str]) -> ColumnElement[bool]:
    """Jobs whose (backend, GPU kind) is one of `kinds` (false when there are none)."""
    return or_(false(), *(and_(Job.backend == backend, Job.gpu == gpu) for backend, gpu in sorted(kinds)))


def _admit_to_kueue(session: Session, kueue: dict[tuple[str, str], str], of_kueue: ColumnElement[bool],
                    free: ColumnElement[bool], *, now: datetime, room: int, postgres: bool,
                    into: list[int]) -> None:
    """Admit up to `room` waiting jobs of the Kueue pools' kinds to their pool, appending their ids to
    `into`: no engine, no quota; Kueue decides when they run."""
    stmt = (select(Job.id, Job.backend, Job.gpu)
            .where(Job.status == S.QUEUED, Job.pool.is_(None), free, of_kueue)
            .order_by(Job.priority.desc(), Job.id).limit(room))
    if postgres:
        stmt = stmt.with_for_update(skip_locked=True)
    for job_id, backend, gpu in session.execute(stmt).all():
        pool = kueue[(getattr(backend, "value", str(backend)), gpu)]
        written = session.execute(
            update(Job).where(and_(Job.id == job_id, Job.status == S.QUEUED, Job.pool.is_(None)))
            .values(pool=pool, admitted_at=now).execution_options(synchronize_session=False))
        if getattr(written, "rowcount", 0) == 1:
            into.append(job_id)


def lease(session: Session, *, now: datetime, owner: str, lease_s: float, batch: int,
          params: SnapshotParams) -> LeaseResult:
    """Lease up to `batch` jobs in the caller's transaction (see the module's docstring)."""
    postgres = session.get_bind().dialect.name == "postgresql"
    pools = effective_pools(session, params.local_gpus)
    managed = sorted({p.pool.backend.value for p in pools})
    kueue = kueue_kinds(pools)
    of_kueue = _of_kinds(kueue)
    # no lease held, and no retry's back-off (`not_before`) under way
    free = and_(or_(Job.lease_expires_at.is_(None), Job.lease_expires_at < now),
                or_(Job.not_before.is_(None), Job.not_before < now))
    holds = or_(Job.status == S.SUBMITTING, Job.pool.is_not(None))
    if managed:
        holds = or_(holds, Job.backend.not_in(managed))
    else:  # nothing to admit: every queued job goes, as before admission (Kueue's below, with their pool)
        holds = or_(holds, and_(Job.status == S.QUEUED, not_(of_kueue)) if kueue else Job.status == S.QUEUED)
    stmt = (select(Job.id).where(Job.status.in_(UNSUBMITTED), free, holds)
            .order_by(Job.priority.desc(), Job.id).limit(batch))
    if postgres:
        stmt = stmt.with_for_update(skip_locked=True)
    result = LeaseResult(ids=list(session.scalars(stmt)))
    if kueue and len(result.ids) < batch:
        _admit_to_kueue(session, kueue, of_kueue, free, now=now, room=batch - len(result.ids),
                        postgres=postgres, into=result.ids)
    if managed and _try_lock(session):
        # the dispatcher needs admissions and preemptions only: no reasons, and the walk stops once
        # nothing else can change this cycle (same decisions as the full `admit`, tested)
        decision: Decision = engine.admit(build_snapshot(session, params, now=now), reasons=False)
        result.decision = decision
        for admission in decision.admitted:
            written = session.execute(
                update(Job).where(and_(Job.id == admission.job_id, Job.status == S.QUEUED, Job.pool.is_(None)))
                .values(pool=admission.pool, admitted_at=now).execution_options(synchronize_session=False))
            if getattr(written, "rowcount", 0) == 1 and len(result.ids) < batch:
                result.ids.append(admission.job_id)
    if result.ids:
        session.execute(update(Job).where(Job.id.in_(result.ids)).values(
            lease_owner=owner, lease_expires_at=now + timedelta(seconds=lease_s), not_before=None)
            .execution_options(synchronize_session=False))
    return result


__all__ = ["ADMISSION_LOCK_KEY", "LeaseResult", "lease"]
