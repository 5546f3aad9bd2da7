"""GPU usage per team and GPU kind, from attempts: what `GET /v1/teams/{team}/usage`, `/metrics`
and the fair-share order read.

An attempt uses `job.gpus` GPUs of `job.gpu` from `attempt.started_at` (when it was seen RUNNING)
until it ended (`attempt.finished_at`, else the job's `finished_at`, else now). Attempts never seen
running count nothing. Queries select narrow columns of the attempts that overlap the window (never
a spec or plan document); the arithmetic is done here, the same on both databases.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, func, or_, select
from sqlalchemy.orm import Session

from service.store.models import Attempt, Job, Team, as_utc

#: decayed usage older than this many half-lives weighs under 1/1024 of fresh usage: not read
HORIZON_HALF_LIVES = 10

Usage = dict[str, dict[str, float]]  # team -> GPU kind -> GPU-seconds


def _intervals(session: Session, since: datetime, team_id: int | None) -> Iterable[tuple[str, str, int, datetime,
                                                                                         datetime | None]]:
    end = func.coalesce(Attempt.finished_at, Job.finished_at)
    stmt = (select(Team.name, Job.gpu, Job.gpus, Attempt.started_at, end).select_from(Attempt)
            .join(Job, Job.id == Attempt.job_id).join(Team, Team.id == Job.team_id)
            .where(Attempt.started_at.is_not(None), or_(end.is_(None), end > since)))
    if team_id is not None:
        stmt = stmt.where(Job.team_id == team_id)
    for team, gpu, gpus, started, ended in session.execute(stmt):
        assert started is not None  # selected so
        yield team, gpu, gpus, as_utc(started), as_utc(ended) if ended is not None else None


def gpu_seconds(session: Session, *, since: datetime, now: datetime, team_id: int | None = None) -> Usage:
    """GPU-seconds used in [since, now] per team and GPU kind (one team with `team_id`)."""
    since, now = as_utc(since), as_utc(now)
    out: Usage = defaultdict(lambda: defaultdict(float))
    for team, gpu, gpus, started, ended in _intervals(session, since, team_id):
        seconds = (min(ended or now, now) - max(started, since)).total_seconds()
        if seconds > 0:
            out[team][gpu] += gpus * seconds
    return {t: dict(kinds) for t, kinds in out.items()}


def decayed_usage(session: Session, *, now: datetime, half_life_s: float) -> Usage:
    """GPU-seconds per team and kind, each second weighed 2^(-age / half_life): the integral of
    gpus * 2^(-(now - t) / h) over each attempt's run, so usage fades as Slurm's
    PriorityDecayHalfLife fades it."""
    now = as_utc(now)
    rate = math.log(2) / half_life_s
    since = now - timedelta(seconds=half_life_s * HORIZON_HALF_LIVES)
    out: Usage = defaultdict(lambda: defaultdict(float))
    for team, gpu, gpus, started, ended in _intervals(session, since, None):
        age_end = max(0.0, (now - min(ended or now, now)).total_seconds())
        age_start = max(age_end, (now - started).total_seconds())
        value = gpus * (math.exp(-rate * age_end) - math.exp(-rate * age_start)) / rate
        if value > 0:
            out[team][gpu] += value
    return {t: dict(kinds) for t, kinds in out.items()}


def total_gpu_seconds(session: Session, *, now: datetime) -> dict[tuple[str, str], float]:
    """GPU-seconds every attempt has used, per (team, GPU kind), summed by the database in one
    aggregate (for `/metrics`, a counter: it only grows while rows stay)."""
    now = as_utc(now)
    end = func.coalesce(Attempt.finished_at, Job.finished_at)
    seconds: ColumnElement[Any]
    if session.get_bind().dialect.name == "postgresql":
        seconds = func.extract("epoch", func.coalesce(end, now) - Attempt.started_at)
    else:  # SQLite keeps UTC wall-clock text; julianday() reads it
        stamp = now.replace(tzinfo=None).isoformat(sep=" ")
        seconds = (func.julianday(func.coalesce(end, stamp)) - func.julianday(Attempt.started_at)) * 86400.0
    rows = session.execute(
        select(Team.name, Job.gpu, func.sum(Job.gpus * seconds)).select_from(Attempt)
        .join(Job, Job.id == Attempt.job_id).join(Team, Team.id == Job.team_id)
        .where(Attempt.started_at.is_not(None)).group_by(Team.name, Job.gpu))
    return {(team, gpu): max(0.0, float(total or 0.0)) for team, gpu, total in rows}


__all__ = ["Usage", "decayed_usage", "gpu_seconds", "total_gpu_seconds"]
