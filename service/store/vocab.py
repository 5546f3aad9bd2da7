"""Every state and kind the store keeps, one enum per vocabulary.

Columns hold the enums' string values, so rows written before these enums existed read back
unchanged and no data migrates. Event kinds are an open set (`job.<status>` for each transition
plus the constants below), so they are constants, not an enum. `FailureClass` and `MeasurementKind`
live in pure modules (`service.failures`, `service.jobenv`) that backends and jobs may import too.
"""

from __future__ import annotations

from enum import StrEnum

from service.failures import FailureClass
from service.jobenv import MeasurementKind

__all__ = ["AttemptStatus", "EventKind", "FailureClass", "JobStatus", "MeasurementKind", "Role"]


class JobStatus(StrEnum):
    """Where a job is in its life; `service.store.states` says which may follow which."""

    QUEUED = "QUEUED"
    SUBMITTING = "SUBMITTING"
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    CANCELLING = "CANCELLING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


class AttemptStatus(StrEnum):
    """Where one backend submission of a job is, as the dispatcher last saw it."""

    SUBMITTING = "SUBMITTING"
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    MISSING = "MISSING"  # the backend no longer knew the submission
    PREEMPTED = "PREEMPTED"  # the backend requeued this same submission; the next attempt continues it


class Role(StrEnum):
    """What a token may do: everything; its team's jobs; report for one job."""

    ADMIN = "admin"
    MEMBER = "member"
    JOB = "job"


class EventKind:
    """Event kinds besides `job.<status>` (`EventKind.status`, `EventKind.measurement`)."""

    RESUME_SUBMIT = "job.resume_submit"
    REQUEUED = "job.requeued"
    BACKEND_UNREACHABLE = "backend.unreachable"
    PROFILE_FAILED = "job.profile_failed"
    PREEMPTED = "job.preempted"  # data: by (the job that needed the devices), reason, attempt, grace_s
    #: data: reason (the backend's own words, or None), expected_start (epoch seconds, or None), attempt;
    #: appended only when the backend's reason or (rounded) start estimate for the attempt changes
    BACKEND_PENDING = "job.backend_pending"
    #: an attempt ran out of memory and the job was planned again (`service.planner.replan`); data: attempt,
    #: failure, rung, old_layout, new_layout (layout dicts), old/new (one-line layouts), measured_peak_bytes,
    #: limit_bytes, predicted_bytes, new_predicted_bytes, cap_bytes, scale, replan, max_replans
    REPLANNED = "job.replanned"
    #: an attempt ran out of memory and was not planned again (max_replans reached, or no rung fits); data: the
    #: attempt, failure, reason, measured_peak_bytes, replans, max_replans. The job then fails as before.
    REPLAN_REFUSED = "job.replan_refused"

    @staticmethod
    def status(status: JobStatus) -> str:
        """The kind of the event a transition to `status` appends, e.g. `job.running`."""
        return f"job.{status.value.lower()}"

    @staticmethod
    def measurement(kind: MeasurementKind) -> str:
        """The kind of the event a report or profile appends, e.g. `job.report`."""
        return f"job.{kind.value}"
