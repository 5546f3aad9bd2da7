"""Inserting planned jobs: one job or a batch, with their `job.queued` events, in the caller's transaction.

The submission path (`service.api.submission`) calls this once per request, single or batch, so a
job, its event, its webhook deliveries and its idempotency key commit together or not at all.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.orm import Session

from service.store.jobs import NewJob
from service.store.models import IdempotencyKey, Job
from service.store.states import add_event
from service.store.vocab import EventKind, JobStatus

QUEUED_MESSAGE = "planned and queued"


def queued_job(new: NewJob, *, actor: str) -> Job:
    """The QUEUED row of `new`, with the list-view columns copied from its plan (not yet added)."""
    spec, plan = new.spec, new.plan
    return Job(name=spec.name, team=new.team, team_id=new.team.id, status=JobStatus.QUEUED,
               backend=spec.backend.kind, priority=spec.priority, spec=spec, plan=plan, created_by=actor,
               layout=plan.layout.short()[:200], predicted_step_s=plan.time.step_s,
               gpu=plan.gpu, gpus=plan.world_size,
               predicted_s=plan.time.step_s * plan.training.steps if plan.training is not None else None)


def insert_jobs(session: Session, batch: Sequence[NewJob], *, actor: str,
                idempotency: tuple[str, str, str] | None = None) -> list[Job]:
    """Insert QUEUED jobs for `batch` (in its order), one `job.queued` event each (and the webhook
    deliveries it matches), and the idempotency key (scope, key, body hash) of a single submission.

    Two flushes whatever the batch size: the jobs (their ids), then the events and the key; the
    returned rows carry their ids, timestamps and team, so a response needs no read back. A racing
    request with the same idempotency key makes the flush fail with `IntegrityError` (the caller
    looks the key up again).
    """
    if idempotency is not None and len(batch) != 1:
        raise ValueError("an idempotency key names one job: submit a batch without one")
    jobs = [queued_job(new, actor=actor) for new in batch]
    session.add_all(jobs)
    session.flush()
    for job, new in zip(jobs, batch, strict=True):
        add_event(session, job, actor=actor, kind=EventKind.status(JobStatus.QUEUED), message=QUEUED_MESSAGE,
                  data={"layout": new.plan.layout.to_dict(), "step_s": new.plan.time.step_s})
    if idempotency is not None:
        scope, key, digest = idempotency
        session.add(IdempotencyKey(scope=scope, key=key, body_hash=digest, job_id=jobs[0].id))
    session.flush()
    return jobs


__all__ = ["QUEUED_MESSAGE", "insert_jobs", "queued_job"]
