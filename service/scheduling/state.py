"""What the scheduling engine decides from: a snapshot of pools, quotas, running and waiting jobs.

The dispatcher (admission), the explain endpoint and the simulator each build a `Snapshot` (from
the store, or from a trace) and hand it to `service.scheduling.engine`; the engine reads nothing
else, so the same snapshot always gives the same decisions. Times are seconds since the epoch.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from service.scheduling.model import Pool, TeamQuota


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class WaitingJob(_Frozen):
    """A QUEUED job (never admitted, or back in the queue after a preemption or a retry)."""

    id: int
    team: str
    backend: str
    gpu: str = Field(description="GPU kind the plan needs (or cpu).")
    gpus: int = Field(ge=1, description="GPUs (or cpu slots) it needs, all in one pool.")
    priority: int = 0
    submitted_at: float = Field(description="When it was first submitted: a requeued job keeps its place.")
    pool: str | None = Field(None, description="The pool its spec pins, if any.")
    predicted_s: float | None = Field(None, description="Predicted run time: steps x the plan's step time.")
    not_before: float | None = Field(None, description="Retry backoff: not admitted before this time.")


class RunningJob(_Frozen):
    """An admitted job (SUBMITTING, PENDING, RUNNING or CANCELLING) holding GPUs of one pool."""

    id: int
    team: str
    pool: str
    gpu: str
    gpus: int = Field(ge=1)
    priority: int = 0
    admitted_at: float
    started_at: float | None = Field(None, description="When the current attempt began running.")
    checkpoint_at: float | None = Field(None, description="When its last checkpoint was written, if known.")
    remaining_s: float | None = Field(None, description="Predicted time left (measured step time when known).")
    preemptible: bool = Field(True, description="False while it is being preempted or cancelled already.")


class Snapshot(_Frozen):
    """Everything one scheduling decision reads."""

    now: float
    pools: list[Pool]
    quotas: dict[str, TeamQuota] = Field(description="By team name; a team absent here has no quota at all.")
    running: list[RunningJob] = Field(default_factory=list)
    waiting: list[WaitingJob] = Field(default_factory=list)
    usage: dict[str, dict[str, float]] = Field(
        default_factory=dict, description="Past usage per team and GPU kind: GPU-seconds decayed with the"
        " configured half-life (the historical part of fair share).")
    usage_blend: float = Field(0.5, ge=0, le=1, description="Weight of past usage against current use in the"
                               " fair-share order (0: current use only).")
    min_runtime_s: float = Field(600.0, ge=0, description="A job younger than this is never preempted.")
    reserve_after_s: float = Field(900.0, ge=0, description="A job blocked this long since submission (or since"
                                   " its backoff ended) reserves what it waits for: later jobs may not take it.")
    default_quota: TeamQuota | None = Field(None, description="Quota of a team absent from `quotas` (None: such"
                                            " a team has no quota at all).")
    eta_unknown_s: float = Field(3600.0, ge=0, description="The ETA band's latest edge assumes a job of unknown"
                                 " duration runs this long (its earliest edge: 0).")
