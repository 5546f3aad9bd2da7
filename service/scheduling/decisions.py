"""What the scheduling engine answers: admissions, preemptions, and why each other job waits."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, Field


class ReasonCode(StrEnum):
    QUOTA_EXCEEDED = "quota_exceeded"  # the team's nominal plus borrowable quota is in use
    EXCEEDS_TEAM_LIMIT = "exceeds_team_limit"  # bigger than the team may ever get
    WAITING_FOR_CAPACITY = "waiting_for_capacity"  # quota allows it; the pool is full
    WAITING_FOR_PRIORITY = "waiting_for_priority"  # higher-priority (or fairer) jobs are ahead
    NO_MATCHING_POOL = "no_matching_pool"
    BACKOFF = "backoff"  # a retry waiting out its backoff
    BACKEND_PENDING = "backend_pending"  # admitted; the backend's own reason


class Reason(BaseModel):
    code: ReasonCode
    message: str = Field(description="One sentence a user understands, with the numbers.")
    flavor: str | None = None
    requested: int | None = None
    available: int | None = None
    limit: int | None = None


class Admission(BaseModel):
    job_id: int
    pool: str
    borrowed: int = Field(0, description="GPUs of it above the team's nominal quota.")


class Preemption(BaseModel):
    victim: int
    by: int = Field(description="The waiting job it makes room for.")
    reason: str = Field(description="Why, naming the rule (reclaim or priority) and the teams.")


class Decision(BaseModel):
    """One admission cycle's answer. `order` is every waiting job in admission order."""

    admitted: list[Admission] = Field(default_factory=list)
    preempted: list[Preemption] = Field(default_factory=list)
    waiting: dict[int, list[Reason]] = Field(default_factory=dict)
    order: list[int] = Field(default_factory=list)


class Eta(BaseModel):
    earliest_s: float | None
    latest_s: float | None
    method: str = Field(description="How the band was computed.")
    backend_start_s: float | None = Field(None, description="For a job handed to its backend: the backend's own"
                                          " estimate of its start, seconds from now (Slurm's `squeue --start`);"
                                          " None when the backend gives none.")


class Ahead(BaseModel):
    """A job ahead of the one explained: named only when it is the caller's own team's."""

    job_id: int
    team: str
    gpus: int
    priority: int


class Explanation(BaseModel):
    """`GET /v1/jobs/{id}/explain` for a job that is not running."""

    status: str
    admitted: bool
    reasons: list[Reason] = Field(default_factory=list)
    position: dict[str, int] = Field(default_factory=dict, description='{"team": n, "pool": n}, 1-based.')
    ahead: list[Ahead] = Field(default_factory=list, description="The jobs ahead that the caller may name: its"
                               " own team's (`ahead_scope` team), or every team's for an admin (`every_team`).")
    ahead_scope: Literal["team", "every_team"] = Field(
        "team", description="Whose jobs `ahead` lists: the job's team's (a member; other teams' are only counted"
        " in `ahead_other_teams`), or every team's (an admin).")
    ahead_other_teams: dict[str, int] = Field(default_factory=dict,
                                              description='Others counted, never named: {"jobs": n, "gpus": n}.')
    eta: Eta | None = None
    pool: str | None = Field(None, description="The pool it was admitted to, once admitted.")
    as_of: float | None = Field(None, description="For a waiting job answered from the dispatcher's queue view: when"
                                " that view was computed (seconds since the epoch); None when computed for this"
                                " request. The ETA band is counted from now either way.")
    note: str | None = Field(None, description="For a job that does not wait for admission: what it does instead"
                             " (running, finished, left to the backend's own scheduler).")
