"""Store rows -> response models."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel
from sqlalchemy.orm import Session

from service.api.errors import ApiError
from service.api.schemas import (
    AttemptOut,
    EventOut,
    JobOut,
    JobPage,
    JobSummary,
    MeasurementOut,
    TeamOut,
    TokenOut,
)
from service.jobenv import MeasurementKind
from service.planner.calibration import prediction_error
from service.redaction import REDACTED, redact_value
from service.spec import TrainingSpec
from service.store.jobs import JobDetail, latest_measurements
from service.store.models import ApiToken, Event, Job, Team


def redacted_spec(spec: TrainingSpec) -> TrainingSpec:
    """`spec` as responses show it: entrypoint.env is write-only, its names kept and every value
    `<redacted>` but those the spec names in `entrypoint.public_env` (the env is where API keys and
    database URLs go; whoever submitted it has the file); the command line and the image with the
    credentials they carry hidden (`redact_value`: a URL's password, a token's shape), as the launch
    preview shows them. A copy: the stored spec is unchanged."""
    entry = spec.entrypoint
    if entry is None:
        return spec
    public = set(entry.public_env)
    shown = {name: value if name in public else REDACTED for name, value in entry.env.items()}
    return spec.model_copy(update={"entrypoint": entry.model_copy(update={
        "env": shown, "command": [redact_value(arg) for arg in entry.command],
        "image": None if entry.image is None else redact_value(entry.image)})})


def encoded(model: BaseModel) -> bytes:
    """`model` as JSON by pydantic's serializer (no intermediate dict). Raises `ApiError` 422 for a
    value no response can carry (a lone surrogate), so that the transaction writing it rolls back
    instead of committing a row every later read of the job fails on."""
    try:
        return model.__pydantic_serializer__.to_json(model)
    except (ValueError, RecursionError) as exc:  # pydantic's serialisation errors are ValueErrors
        raise ApiError(422, "validation_error", "the request holds a value that cannot be stored and read back"
                       f" ({type(exc).__name__}); send finite numbers and valid Unicode") from exc


def job_summary(job: Job | Any, team: str) -> JobSummary:
    """From columns only: the spec and plan documents stay unloaded in list views. `job` is an ORM
    `Job` or a Core row of the list's columns; `team` its team's name."""
    return JobSummary(
        id=job.id, name=job.name, team=team, status=job.status,
        backend=job.backend, priority=job.priority, created_at=job.created_at, updated_at=job.updated_at,
        finished_at=job.finished_at, layout=job.layout, predicted_step_s=job.predicted_step_s)


def job_page(rows: Sequence[Any], next_cursor: str | None) -> JobPage:
    """A list page from Core rows of the list's columns (`list_job_rows`: `team_name` among them), as
    `job_summary` makes each item, validated in one call: for 20 to 50 rows a sixth to a quarter less
    CPU than a model constructed per row. Each row becomes a dict by zipping the column names with its
    values, a quarter of the CPU of `{**row._mapping}` (which built a mapping view per row; it was
    more than validating the page)."""
    names = tuple("team" if name == "team_name" else name for name in rows[0]._fields) if rows else ()
    return JobPage.model_validate({"items": [dict(zip(names, row, strict=True)) for row in rows],
                                   "next_cursor": next_cursor})


def job_out(session: Session, job: Job) -> JobOut:
    """From a loaded `Job`: its attempts (loaded now unless they were) and newest measurements."""
    return detail_out(JobDetail(job, job.team.name, job.attempts, latest_measurements(session, job.id)))


def detail_out(detail: JobDetail) -> JobOut:
    """The job as `GET /v1/jobs/{id}` shows it. `detail` holds ORM objects or Core rows: each has the
    columns' names as attributes."""
    job = detail.job
    summary = job_summary(job, detail.team)
    report = next((m for m in detail.measured if m.kind == MeasurementKind.REPORT), None)
    return JobOut(
        **summary.model_dump(), spec=redacted_spec(job.spec), plan=job.plan,
        attempts=[AttemptOut(number=a.number, backend_name=a.backend_name, backend_id=a.backend_id, nodes=a.nodes,
                             status=a.status, exit_code=a.exit_code, exit_reason=a.exit_reason,
                             created_at=a.created_at, finished_at=a.finished_at, failure=a.failure,
                             log_tail=a.log_tail) for a in detail.attempts],
        measurements={m.kind: MeasurementOut(kind=m.kind, at=m.at, data=m.data) for m in detail.measured},
        prediction_error=prediction_error(job.plan, report.data if report is not None else None),
    )


def event_out(event: Event) -> EventOut:
    return EventOut(id=event.id, job_id=event.job_id, at=event.at, actor=event.actor, kind=event.kind,
                    message=event.message, data=event.data)


def team_out(team: Team) -> TeamOut:
    return TeamOut(id=team.id, name=team.name, created_at=team.created_at)


def token_out(token: ApiToken) -> TokenOut:
    return TokenOut(id=token.id, role=token.role, team=token.team.name if token.team else None,
                    job_id=token.job_id, name=token.name, created_at=token.created_at,
                    expires_at=token.expires_at, revoked_at=token.revoked_at)
