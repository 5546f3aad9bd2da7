"""What a backend reports about one submission (`Observation`): the answer of every backend's `poll`
and the input of `service.lifecycle_decide.decide`, which turns it into the store's changes.

Pure: pydantic and the failure classes only, so backends, the dispatcher and the lifecycle rules share it.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, Field

from service.failures import FailureClass


class RunState(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    MISSING = "MISSING"  # the backend does not know this name (never submitted, or long gone)


class Observation(BaseModel):
    """What the backend says about one submission."""

    state: RunState
    nodes: list[str] = Field(default_factory=list)
    exit_code: int | None = None
    failure: FailureClass | None = None
    reason: str | None = None
    log_tail: str | None = None
    requeues: int = Field(0, description="Times the backend requeued this same submission (preemption).")
    requeue_reasons: list[str] = Field(default_factory=list)
    pending_reason: str | None = Field(None, description="While PENDING: why the backend itself holds it, in the"
                                       " backend's own words (Slurm's squeue reason such as `Resources`, a pod's"
                                       " Unschedulable message, a Kueue admission wait); None when it gives none.")
    expected_start: float | None = Field(None, description="While PENDING: when the backend expects to start it,"
                                         " epoch seconds (Slurm's `squeue --start` estimate); None when it has none.")
