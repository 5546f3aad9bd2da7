"""Moving a job between states in the store: `transition`, the only writer of a job's status, holds every
move to `service.lifecycle.ALLOWED` (the table and the named sets of states live there).

Terminal states are final. `transition` changes a job and appends its event in the caller's
transaction, so both land or neither does.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from service.lifecycle import TERMINAL, allowed
from service.observability.transitions import record_transition
from service.store.models import Event, Job, utcnow
from service.store.vocab import EventKind, JobStatus
from service.store.webhooks import enqueue as enqueue_deliveries

S = JobStatus


class IllegalTransition(ValueError):
    def __init__(self, job_id: int, current: JobStatus, wanted: JobStatus) -> None:
        self.job_id, self.current, self.wanted = job_id, current, wanted
        final = " (terminal states are final)" if current in TERMINAL else ""
        super().__init__(f"job {job_id}: {current} -> {wanted} is not allowed{final}")


def add_event(session: Session, job: Job, *, actor: str, kind: str, message: str = "",
              data: dict[str, Any] | None = None) -> Event:
    """Append an event to `job`'s history, and its webhook deliveries to the outbox
    (`service.store.webhooks.enqueue`), in the caller's transaction."""
    event = Event(job_id=job.id, actor=actor, kind=kind, message=message, data=data or {})
    session.add(event)
    enqueue_deliveries(session, job, event)
    return event


def transition(session: Session, job: Job, to: JobStatus, *, actor: str, message: str = "",
               data: dict[str, Any] | None = None) -> Event:
    """Move `job` to `to` and append a `job.<status>` event; raise `IllegalTransition` otherwise. Once the
    transaction commits, the move is logged (`shardctl.jobs`: job_id, from, to, actor) and counted."""
    current = job.status
    if not allowed(current, to):
        raise IllegalTransition(job.id, current, to)
    job.status = to
    now = utcnow()
    job.updated_at = now
    if to in TERMINAL:
        job.finished_at = now
    if to == S.QUEUED:  # back in the queue (a retry, a preemption): it gives up its admission, keeps its place
        job.pool = job.admitted_at = None
    # One log line and the job metrics, when this transaction commits (service.observability.transitions).
    record_transition(session, job, current, actor=actor, message=message, data=data or {})
    return add_event(session, job, actor=actor, kind=EventKind.status(to), message=message,
                     data={"from": current.value, "to": to.value, **(data or {})})
