"""SQLAlchemy 2 models: teams, tokens, dashboard sessions, jobs, attempts, events, idempotency keys and
measurements.

Every column the API filters or sorts on has an index. JSON documents (spec, plan, event data,
measurements) use the generic JSON type: JSONB on PostgreSQL, text on SQLite. A job's spec and
plan read back as `TrainingSpec` and `Plan`; states and kinds as the enums of `vocab` (stored as
their string values, so the schema is what it was before they were typed).
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Generic, TypeVar

from pydantic import BaseModel
from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy import Enum as SqlEnum
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator, TypeEngine

from service.backend_options import BackendKind
from service.planner.result import Plan
from service.scheduling.model import Pool as SchedPool
from service.scheduling.model import TeamQuota
from service.spec import TrainingSpec
from service.store.vocab import AttemptStatus, FailureClass, JobStatus, MeasurementKind, Role

# BIGINT on PostgreSQL, INTEGER on SQLite (so that it stays the rowid alias and autoincrements).
BigId = BigInteger().with_variant(Integer(), "sqlite")
Json = JSON().with_variant(JSONB(), "postgresql")

M = TypeVar("M", bound=BaseModel)


class ModelJson(TypeDecorator[M], Generic[M]):
    """A pydantic model stored as a JSON document (JSONB on PostgreSQL) and validated when read."""

    impl = JSON
    cache_ok = True

    def __init__(self, model: type[M]) -> None:
        super().__init__()
        self.model = model

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        return dialect.type_descriptor(JSONB() if dialect.name == "postgresql" else JSON())

    def process_bind_param(self, value: M | None, dialect: Dialect) -> Any:
        return None if value is None else value.model_dump(mode="json")

    def process_result_value(self, value: Any, dialect: Dialect) -> M | None:
        return None if value is None else self.model.model_validate(value)


E = TypeVar("E", bound=StrEnum)


def enum_column(enum: type[E], length: int) -> SqlEnum:
    """A VARCHAR(length) holding the enum's values (no database enum type, no CHECK constraint)."""
    return SqlEnum(enum, native_enum=False, create_constraint=False, length=length, validate_strings=True,
                   values_callable=lambda members: [m.value for m in members])


NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(at: datetime) -> datetime:
    """`at` as an aware UTC datetime (a naive one is taken to be UTC already); `at` itself when its
    zone is `UTC` (as PostgreSQL's are read, `make_engine`)."""
    if at.tzinfo is UTC:
        return at
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


class UtcDateTime(TypeDecorator[datetime]):
    """`DateTime(timezone=True)` that always reads back as an aware UTC datetime, on both databases.

    SQLite has no time zones: the value is stored as UTC wall-clock time (as before) and given its
    +00:00 offset back when read. PostgreSQL returns the session's time zone; it is converted to UTC.
    The column type in the schema is unchanged, so migrations show no drift.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        at = as_utc(value)
        return at.replace(tzinfo=None) if dialect.name == "sqlite" else at

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else as_utc(value)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Team(Base):
    __tablename__ = "teams"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    name: Mapped[str] = mapped_column(String(63), unique=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)


class ApiToken(Base):
    """A bearer token. Only the SHA-256 of its secret is stored; `id` is the public part."""

    __tablename__ = "api_tokens"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    secret_hash: Mapped[str] = mapped_column(String(64))
    role: Mapped[Role] = mapped_column(enum_column(Role, 16))
    team_id: Mapped[int | None] = mapped_column(ForeignKey("teams.id"), index=True)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id"), index=True)
    name: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    revoked_at: Mapped[datetime | None] = mapped_column(UtcDateTime())

    team: Mapped[Team | None] = relationship(lazy="joined")


class UiSessionRow(Base):
    """A dashboard sign-in (`service.store.ui_sessions`), made with the API token `token_id`. The cookie
    holds the session's id; only its SHA-256 is stored, as the primary key (the lookup of every page)."""

    __tablename__ = "ui_sessions"

    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    token_id: Mapped[str] = mapped_column(ForeignKey("api_tokens.id"), index=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime())


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        Index("ix_jobs_status_id", "status", "id"),
        Index("ix_jobs_team_id_id", "team_id", "id"),
        Index("ix_jobs_backend_id", "backend", "id"),
        Index("ix_jobs_name_id", "name", "id"),
        # the Jobs list's sorts (migration 0007); team-led for members and the team filter
        Index("ix_jobs_gpus_id", "gpus", "id"),
        Index("ix_jobs_finished_at_id", "finished_at", "id"),
        Index("ix_jobs_team_id_status_id", "team_id", "status", "id"),
        Index("ix_jobs_team_id_gpus_id", "team_id", "gpus", "id"),
        Index("ix_jobs_team_id_name_id", "team_id", "name", "id"),
        Index("ix_jobs_team_id_finished_at_id", "team_id", "finished_at", "id"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id"))
    status: Mapped[JobStatus] = mapped_column(enum_column(JobStatus, 16))
    backend: Mapped[BackendKind] = mapped_column(enum_column(BackendKind, 16))
    priority: Mapped[int] = mapped_column(Integer, default=0)
    spec: Mapped[TrainingSpec] = mapped_column(ModelJson(TrainingSpec), deferred=True)
    plan: Mapped[Plan] = mapped_column(ModelJson(Plan), deferred=True)
    # Copied from the plan at submission, so that list views never decode the JSON documents.
    layout: Mapped[str] = mapped_column(String(200), default="")
    predicted_step_s: Mapped[float | None] = mapped_column(Float)
    created_by: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    # Dispatcher lease: who holds the row and until when.
    lease_owner: Mapped[str | None] = mapped_column(String(64))
    lease_expires_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    # A retry's back-off: no dispatcher leases the job before this time (None: at once).
    not_before: Mapped[datetime | None] = mapped_column(UtcDateTime())
    # Shared GPUs: what it needs, copied from the plan at submission, and where it was admitted.
    gpu: Mapped[str] = mapped_column(String(64), default="")  # the GPU kind (or cpu)
    gpus: Mapped[int] = mapped_column(Integer, default=1)  # GPUs (cpu slots) it needs: the plan's world size
    pool: Mapped[str | None] = mapped_column(String(63))  # the pool it was admitted to; None while it waits
    admitted_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    predicted_s: Mapped[float | None] = mapped_column(Float)  # the plan's steps x step time: the ETA's input

    team: Mapped[Team] = relationship(lazy="joined", innerjoin=True)
    attempts: Mapped[list[Attempt]] = relationship(order_by="Attempt.number", lazy="select")


class Attempt(Base):
    """One backend submission of a job; its name `shardctl-<job id>-<number>` is deterministic."""

    __tablename__ = "attempts"
    __table_args__ = (UniqueConstraint("job_id", "number"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    backend_name: Mapped[str] = mapped_column(String(128))
    backend_id: Mapped[str | None] = mapped_column(String(128))
    nodes: Mapped[list[str]] = mapped_column(Json, default=list)
    status: Mapped[AttemptStatus] = mapped_column(enum_column(AttemptStatus, 16))
    exit_code: Mapped[int | None] = mapped_column(Integer)
    exit_reason: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    #: why it ended badly (None while it runs and when it succeeded); `exit_code` is the program's own
    failure: Mapped[FailureClass | None] = mapped_column(enum_column(FailureClass, 32))
    #: the last lines the program itself printed (the launcher's noise left out), when it failed
    log_tail: Mapped[str | None] = mapped_column(Text)
    #: when it began RUNNING (GPU-seconds of usage count from here); None if it was never seen running
    started_at: Mapped[datetime | None] = mapped_column(UtcDateTime())


class Event(Base):
    """Append-only history of a job: every state change and everything worth telling."""

    __tablename__ = "events"
    __table_args__ = (Index("ix_events_job_id_id", "job_id", "id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"))
    at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    actor: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(64))
    message: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[dict[str, Any]] = mapped_column(Json, default=dict)


class IdempotencyKey(Base):
    """`Idempotency-Key` of a submission, scoped to the submitting team, with the body's hash."""

    __tablename__ = "idempotency_keys"
    __table_args__ = (UniqueConstraint("scope", "key"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    scope: Mapped[str] = mapped_column(String(80))
    key: Mapped[str] = mapped_column(String(200))
    body_hash: Mapped[str] = mapped_column(String(64))
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)


class Measurement(Base):
    """What a job reported about itself: heartbeats, the final report, profile summaries."""

    __tablename__ = "measurements"
    # (kind, id): calibration reads the reports past its cursor without the heartbeats between them.
    __table_args__ = (Index("ix_measurements_job_id_kind_id", "job_id", "kind", "id"),
                      Index("ix_measurements_kind_id", "kind", "id"))

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"))
    kind: Mapped[MeasurementKind] = mapped_column(enum_column(MeasurementKind, 32))
    at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    data: Mapped[dict[str, Any]] = mapped_column(Json)


# -- shared GPUs: pools and team quotas as the admin declared them ---------------------------------


class PoolRow(Base):
    """A pool (`service.scheduling.model.Pool`): declared through the API, loaded from
    SHARDCTL_POOLS_FILE, or detected on the local machine (`source`)."""

    __tablename__ = "pools"

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    pool: Mapped[SchedPool] = mapped_column(ModelJson(SchedPool))
    source: Mapped[str] = mapped_column(String(16))  # api | file | detected
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)


class TeamQuotaRow(Base):
    """A team's quota (`service.scheduling.model.TeamQuota`); a team without a row has none declared."""

    __tablename__ = "team_quotas"

    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id"), primary_key=True)
    quota: Mapped[TeamQuota] = mapped_column(ModelJson(TeamQuota))
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)

