"""Inserting planned jobs: one job or a batch, with their `job.queued` events, in the caller's transaction.

The submission path (`service.api.submission`) calls this once per request, single or batch, so a
job, its event, its webhook deliveries and its idempotency key commit together or not at all. It is
the API's hottest write, so it is Core statements on the session's connection, not the ORM's unit of
work: the team with everything a submission checks of it, and the stored pools, in one read
(`submitting_team`), then one INSERT of the jobs and one of their events, whatever the batch size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, insert, select, true
from sqlalchemy.orm import Session

from service.backend_options import BackendKind
from service.planner.result import Plan
from service.spec import TrainingSpec
from service.store.jobs import NewJob
from service.store.known_tokens import TOKEN_LIVE, LiveValues, Unproven
from service.store.models import Event, IdempotencyKey, Job, PoolRow, Team, TeamQuotaRow, utcnow
from service.store.pools import SourcedPool
from service.store.tokens import ensure_team
from service.store.vocab import EventKind, JobStatus
from service.store.webhooks import WrittenEvent, enqueue_written, known_unsubscribed, subscribed

QUEUED_MESSAGE = "planned and queued"
QUEUED_KIND = EventKind.status(JobStatus.QUEUED)

# Built once: building a statement costs more CPU than PostgreSQL spends running it. The team's row
# comes once per stored pool (once, with no pool, when there is none): a submission checks both.
_TEAM = (select(Team.id, Team.name, TeamQuotaRow.quota, subscribed(Team.id), PoolRow.pool, PoolRow.source)
         .outerjoin(TeamQuotaRow, TeamQuotaRow.team_id == Team.id).outerjoin(PoolRow, true())
         .where(Team.name == bindparam("name")).order_by(PoolRow.name))
#: `_TEAM` for a principal from `KnownTokens`: it checks the token too (`TOKEN_LIVE`).
_TEAM_CHECKED = _TEAM.where(TOKEN_LIVE)
_INSERT_JOBS = insert(Job).returning(Job.id, sort_by_parameter_order=True)
_INSERT_EVENTS = insert(Event).returning(Event.id, sort_by_parameter_order=True)
# The keys of `_queued_values`: tests/api/test_batch_submit.py fails on PostgreSQL when they part.
_JOB_FIELDS = ("name", "team_id", "status", "backend", "priority", "spec", "plan", "created_by", "created_at",
               "updated_at", "finished_at", "layout", "predicted_step_s", "gpu", "gpus", "predicted_s")
_EVENT_FIELDS = ("at", "actor", "kind", "message", "data")
# One job and its event in one statement (PostgreSQL: a data-modifying CTE): the event's fields are
# bound as event_<field>, with the event column's type.
_QUEUED_JOB = insert(Job).values({f: bindparam(f) for f in _JOB_FIELDS}).returning(Job.id).cte("queued_job")
_INSERT_JOB_AND_EVENT = insert(Event).from_select(
    ["job_id", *_EVENT_FIELDS],
    select(_QUEUED_JOB.c.id, *(bindparam(f"event_{f}", type_=Event.__table__.c[f].type) for f in _EVENT_FIELDS)),
).returning(Event.job_id, Event.id)
_INSERT_KEY = insert(IdempotencyKey)


@dataclass(frozen=True, slots=True)
class SubmittingTeam:
    """What a submission needs of the team it goes into, read in one statement (`submitting_team`)."""

    id: int
    name: str
    #: the highest priority its members may set; None when it has no quota declared
    max_priority: int | None
    #: whether any live webhook gets its events (False: no delivery to enqueue, nothing more to read)
    subscribed: bool
    #: every stored pool, by name, read in the same statement (`pools.in_effect` adds detected ones)
    pools: tuple[SourcedPool, ...]


def submitting_team(session: Session, name: str, *, create: bool = False,
                    live: LiveValues | None = None) -> SubmittingTeam | None:
    """The team `name` with its quota's `max_priority`, whether a webhook gets its events and the
    stored pools, in one read; None when there is no such team, unless `create`: then it is created
    first (`ensure_team`, safe against a racing request). Within the transaction, `enqueue` reads no
    subscriptions of a team found unsubscribed here.

    `live` (`known_tokens.live_values`): the submitter comes from `KnownTokens`, and the read checks
    that its token works (`TOKEN_LIVE`); `Unproven` when it returns no row (no such team, or a token
    that no longer works: nothing is created, and the caller authenticates the token and submits again)."""
    if live is not None:
        rows = session.connection().execute(_TEAM_CHECKED, {"name": name, **live}).all()
        if not rows:
            raise Unproven
    else:
        rows = session.connection().execute(_TEAM, {"name": name}).all()
    if not rows and create:
        ensure_team(session, name)
        rows = session.connection().execute(_TEAM, {"name": name}).all()
    if not rows:
        return None
    row = rows[0]
    pools = tuple(SourcedPool(r[4], r[5]) for r in rows if r[4] is not None)
    team = SubmittingTeam(row[0], row[1], row[2].max_priority if row[2] is not None else None, bool(row[3]), pools)
    if not team.subscribed:
        known_unsubscribed(session, team.id)
    return team


@dataclass(frozen=True, slots=True)
class QueuedJob:
    """A job as `insert_jobs` wrote it: every column a response shows, with nothing read back."""

    id: int
    name: str
    team_id: int
    team_name: str
    backend: BackendKind
    priority: int
    created_at: datetime
    layout: str
    predicted_step_s: float | None
    spec: TrainingSpec
    plan: Plan

    @property
    def status(self) -> JobStatus:
        return JobStatus.QUEUED

    @property
    def updated_at(self) -> datetime:
        return self.created_at

    @property
    def finished_at(self) -> datetime | None:
        return None


def plan_columns(plan: Plan) -> dict[str, Any]:
    """The job list's columns copied from a job's plan (layout, predicted step and run time, GPU kind and
    count): written at submission and again whenever the job's plan changes (an out-of-memory re-plan)."""
    return {"layout": plan.layout.short()[:200], "predicted_step_s": plan.time.step_s, "gpu": plan.gpu,
            "gpus": plan.world_size,
            "predicted_s": plan.time.step_s * plan.training.steps if plan.training is not None else None}


def _queued_values(new: NewJob, *, actor: str, now: datetime) -> dict[str, Any]:
    """The QUEUED row of `new`, with the list-view columns copied from its plan."""
    spec, plan = new.spec, new.plan
    return {"name": spec.name, "team_id": new.team.id, "status": JobStatus.QUEUED, "backend": spec.backend.kind,
            "priority": spec.priority, "spec": spec, "plan": plan, "created_by": actor, "created_at": now,
            "updated_at": now, "finished_at": None, **plan_columns(plan)}


def insert_jobs(session: Session, batch: Sequence[NewJob], *, actor: str,
                idempotency: tuple[str, str, str] | None = None) -> list[QueuedJob]:
    """Insert QUEUED jobs for `batch` (in its order), one `job.queued` event each (and the webhook
    deliveries it matches), and the idempotency key (scope, key, body hash) of a single submission.

    One INSERT of the jobs and one of the events whatever the batch size (one statement for both, for
    one job on PostgreSQL), and one of the key; the returned jobs carry their ids and timestamps, so a
    response needs no read back. A racing request with the same idempotency key makes the key's INSERT
    fail with `IntegrityError` (the caller looks the key up again).
    """
    if idempotency is not None and len(batch) != 1:
        raise ValueError("an idempotency key names one job: submit a batch without one")
    if not batch:
        return []
    conn, now = session.connection(), utcnow()
    rows = [_queued_values(new, actor=actor, now=now) for new in batch]
    data = [{"layout": new.plan.layout.to_dict(), "step_s": new.plan.time.step_s} for new in batch]
    if len(batch) == 1 and conn.dialect.name == "postgresql":
        event = {"event_at": now, "event_actor": actor, "event_kind": QUEUED_KIND, "event_message": QUEUED_MESSAGE,
                 "event_data": data[0]}
        job_id, event_id = conn.execute(_INSERT_JOB_AND_EVENT, {**rows[0], **event}).one()
        ids, event_ids = [job_id], [event_id]
    else:
        ids = list(conn.execute(_INSERT_JOBS, _params(rows)).scalars())
        events = [{"job_id": job_id, "at": now, "actor": actor, "kind": QUEUED_KIND, "message": QUEUED_MESSAGE,
                   "data": event_data} for job_id, event_data in zip(ids, data, strict=True)]
        event_ids = list(conn.execute(_INSERT_EVENTS, _params(events)).scalars())
    jobs = [QueuedJob(id=job_id, name=row["name"], team_id=new.team.id, team_name=new.team.name,
                      backend=row["backend"], priority=row["priority"], created_at=now, layout=row["layout"],
                      predicted_step_s=row["predicted_step_s"], spec=new.spec, plan=new.plan)
            for job_id, row, new in zip(ids, rows, batch, strict=True)]
    for job, event_id, event_data in zip(jobs, event_ids, data, strict=True):
        enqueue_written(session, job.team_id, job.team_name, job,
                        WrittenEvent(event_id, QUEUED_KIND, now, QUEUED_MESSAGE, event_data))
    if idempotency is not None:
        scope, key, digest = idempotency
        conn.execute(_INSERT_KEY, {"scope": scope, "key": key, "body_hash": digest, "job_id": ids[0],
                                   "created_at": now})
    return jobs


def _params(rows: list[dict[str, Any]]) -> list[dict[str, Any]] | dict[str, Any]:
    """One row as one statement's parameters: a list, even of one, takes SQLAlchemy's multi-row path."""
    return rows[0] if len(rows) == 1 else rows


__all__ = ["QUEUED_MESSAGE", "QueuedJob", "SubmittingTeam", "insert_jobs", "plan_columns", "submitting_team"]
