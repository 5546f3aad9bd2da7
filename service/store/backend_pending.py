"""Why the backend holds a job shardctl has handed to it, as the store keeps it: `job.backend_pending`
events (`EventKind.BACKEND_PENDING`).

The dispatcher appends one when the backend's own reason for an attempt, or its start estimate
rounded to `ESTIMATE_STEP_S`, differs from the last one recorded for that attempt (never on every
poll); `GET /v1/jobs/{id}/explain` reads the last one. Data: `{"reason": str | None,
"expected_start": epoch seconds | None, "attempt": n}`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.store.models import Event, as_utc
from service.store.vocab import EventKind

#: Start estimates that differ by less than this are the same estimate (Slurm's moves by seconds as
#: its scheduler re-plans; an event for each move would be noise).
ESTIMATE_STEP_S = 60.0

#: What counts as a change: the reason, and the estimate in `ESTIMATE_STEP_S` steps.
ChangeKey = tuple[str | None, int | None]


def change_key(reason: str | None, expected_start: float | None) -> ChangeKey:
    """The reason and the estimate rounded to `ESTIMATE_STEP_S`: two observations with equal keys are
    the same news."""
    return reason, None if expected_start is None else round(expected_start / ESTIMATE_STEP_S)


@dataclass(frozen=True)
class BackendPending:
    """The last `job.backend_pending` event of one attempt."""

    attempt: int
    reason: str | None
    expected_start: float | None
    at: datetime

    @property
    def key(self) -> ChangeKey:
        return change_key(self.reason, self.expected_start)


def last_backend_pending(session: Session, job_id: int, attempt: int) -> BackendPending | None:
    """The job's latest `job.backend_pending` event, when it is about `attempt` (an older attempt's
    reason says nothing about this one); None otherwise. One indexed query."""
    event = session.scalars(select(Event).where(Event.job_id == job_id, Event.kind == EventKind.BACKEND_PENDING)
                            .order_by(Event.id.desc()).limit(1)).first()
    if event is None or event.data.get("attempt") != attempt:
        return None
    reason, start = event.data.get("reason"), event.data.get("expected_start")
    return BackendPending(attempt=attempt, reason=str(reason) if reason is not None else None,
                          expected_start=float(start) if isinstance(start, int | float) else None,
                          at=as_utc(event.at))
