"""What a job transition tells the operator: one log line (`shardctl.jobs`) and the job metrics of
`service.observability.counters`, both emitted when the transaction that made the transition commits
(a rolled-back transition is neither logged nor counted).

`record_transition` is called by `service.store.states.transition`, inside the caller's transaction;
it captures plain values there (nothing is loaded after the commit) and queues them on the session.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import event, select
from sqlalchemy.orm import Session

from service.lifecycle import MILESTONES, TERMINAL
from service.observability import counters
from service.observability import deliveries as _deliveries  # noqa: F401 (registers its listeners)
from service.redaction import redact_value
from service.store.models import Event, Job, as_utc
from service.store.vocab import EventKind, JobStatus

log = logging.getLogger("shardctl.jobs")

_PENDING = "shardctl.transitions"
#: The event data keys that name an attempt's failure class (the enum's or the older string).
_FAILURE_KEYS = ("failure_class", "failure")


@dataclass(frozen=True, slots=True)
class Moved:
    """One committed-to-be transition, as plain values."""

    job_id: int
    team: str
    backend: str
    source: JobStatus
    target: JobStatus
    actor: str
    message: str  # the event's message, credentials in it hidden (`redact_value`): logs are widely read
    created_at: datetime
    at: datetime
    first: bool  # the job's first time in `target` (for SUBMITTING and RUNNING; else False)
    failure_class: str | None
    attempt: int | None
    exit_code: int | None

    def fields(self) -> dict[str, Any]:
        """The log line's structured fields."""
        out: dict[str, Any] = {"job_id": self.job_id, "team": self.team, "backend": self.backend,
                               "from": self.source.value, "to": self.target.value, "actor": self.actor}
        for key, value in (("attempt", self.attempt), ("failure_class", self.failure_class),
                           ("exit_code", self.exit_code), ("reason", self.message or None)):
            if value is not None:
                out[key] = value
        return out


def failure_class_of(data: dict[str, Any]) -> str | None:
    """The failure class an event's data names (an enum member or its string), or None."""
    for key in _FAILURE_KEYS:
        value = data.get(key)
        if value:
            return str(getattr(value, "value", value))
    return None


def _first_time(session: Session, job: Job, target: JobStatus) -> bool:
    if target not in MILESTONES:
        return False
    earlier = select(Event.id).where(Event.job_id == job.id, Event.kind == EventKind.status(target)).limit(1)
    with session.no_autoflush:  # earlier events are committed already; flush nothing early
        return session.scalar(earlier) is None


def record_transition(session: Session, job: Job, source: JobStatus, *, actor: str, message: str,
                      data: dict[str, Any]) -> None:
    """Queue the log line and observations of `job`'s move from `source` to its current status; call it
    after the status is set and before the transition's event is added."""
    target = job.status
    attempt, exit_code = data.get("attempt"), data.get("exit_code")
    moved = Moved(job_id=job.id, team=job.team.name if job.team is not None else "", backend=str(job.backend),
                  source=source, target=target, actor=actor, message=redact_value(message),
                  created_at=as_utc(job.created_at or job.updated_at), at=as_utc(job.updated_at),
                  first=_first_time(session, job, target), failure_class=failure_class_of(data),
                  attempt=attempt if isinstance(attempt, int) else None,
                  exit_code=exit_code if isinstance(exit_code, int) else None)
    session.info.setdefault(_PENDING, []).append(moved)


def emit(moved: Moved) -> None:
    """Log `moved` and count it."""
    level = logging.WARNING if moved.target == JobStatus.FAILED else logging.INFO
    why = f": {moved.message}" if moved.message else ""
    log.log(level, "job %d %s -> %s%s", moved.job_id, moved.source.value, moved.target.value, why,
            extra=moved.fields())
    labels = {"team": moved.team, "backend": moved.backend}
    waited = max(0.0, (moved.at - moved.created_at).total_seconds())
    if moved.target == JobStatus.SUBMITTING and moved.source == JobStatus.QUEUED:
        counters.ATTEMPTS.labels(**labels).inc()
        if moved.first:
            counters.QUEUE_WAIT.labels(**labels).observe(waited)
    if moved.target == JobStatus.RUNNING and moved.first:
        counters.TIME_TO_RUNNING.labels(**labels).observe(waited)
    failed = moved.target == JobStatus.FAILED or (moved.target == JobStatus.QUEUED and moved.failure_class)
    if failed:
        counters.FAILURES.labels(**labels, failure_class=moved.failure_class or "unknown").inc()
    if moved.target in TERMINAL:
        counters.FINISHED.labels(**labels, status=moved.target.value).inc()


@event.listens_for(Session, "after_commit")
def _after_commit(session: Session) -> None:
    for moved in session.info.pop(_PENDING, ()):
        try:
            emit(moved)
        except Exception:  # observability never breaks the state machine
            log.exception("could not log or count the transition of job %d", moved.job_id)


@event.listens_for(Session, "after_rollback")
def _after_rollback(session: Session) -> None:
    session.info.pop(_PENDING, None)
