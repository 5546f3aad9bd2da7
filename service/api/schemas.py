"""Request and response bodies of the REST API (bytes, seconds, integers; times in UTC ISO 8601)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field, model_validator

from service.backend_options import BackendKind
from service.jobenv import check_measurement
from service.names import Label
from service.planner.calibration import PredictionError
from service.planner.result import Plan
from service.spec import TrainingSpec
from service.store.vocab import AttemptStatus, FailureClass, JobStatus, MeasurementKind, Role


class ErrorField(BaseModel):
    loc: str = Field(description="Dotted path of the field, e.g. training.global_batch.")
    message: str


class ErrorBody(BaseModel):
    code: str = Field(description="Stable machine-readable code, e.g. not_found, validation_error.")
    message: str
    fields: list[ErrorField] = Field(default_factory=list)
    details: dict[str, Any] = Field(default_factory=dict)


class ErrorResponse(BaseModel):
    error: ErrorBody


class AttemptOut(BaseModel):
    number: int
    backend_name: str
    backend_id: str | None
    nodes: list[str]
    status: AttemptStatus
    exit_code: int | None = Field(description="The program's own exit code (not its launcher's); -N: killed by"
                                              " signal N.")
    exit_reason: str | None = Field(description="Why it ended, in words: the backend's evidence.")
    created_at: datetime
    finished_at: datetime | None
    failure: FailureClass | None = Field(None, description="Why it ended badly (see docs/failures.md); null while"
                                                           " it runs and when it succeeded.")
    log_tail: str | None = Field(None, description="The last lines the program itself printed, when it failed.")


class MeasurementOut(BaseModel):
    kind: MeasurementKind
    at: datetime
    data: dict[str, Any]


class JobSummary(BaseModel):
    id: int
    name: str
    team: str
    status: JobStatus
    backend: BackendKind
    priority: int
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    layout: str = Field(description="The planned layout in one line.")
    predicted_step_s: float | None


class JobOut(JobSummary):
    spec: TrainingSpec
    plan: Plan
    attempts: list[AttemptOut]
    measurements: dict[MeasurementKind, MeasurementOut] = Field(description="The newest measurement of each kind.")
    prediction_error: PredictionError | None = Field(
        None, description="The plan's step time and peak memory against the newest report's: ratio ="
        " measured / predicted (null until the job reports).")


class JobPage(BaseModel):
    items: list[JobSummary]
    next_cursor: str | None = Field(description="Pass as ?cursor= (with the same sort) for the next page;"
                                    " null at the end.")


class EventOut(BaseModel):
    id: int
    job_id: int
    at: datetime
    actor: str
    kind: str
    message: str
    data: dict[str, Any]


class TeamIn(BaseModel):
    name: Label = Field(description="Lower-case letters, digits and dashes.")


class TeamOut(BaseModel):
    id: int
    name: str
    created_at: datetime


class TokenIn(BaseModel):
    role: Role = Role.MEMBER
    team: str | None = Field(None, description="Required for member tokens.")
    job_id: int | None = Field(None, ge=1, le=2**63 - 1, description="Required for job tokens.")
    name: str | None = Field(None, max_length=200)
    expires_in_s: int | None = Field(None, gt=0, le=10 * 365 * 86400,
                                     description="Lifetime in seconds (at most 10 years); none: until revoked.")


    @model_validator(mode="after")
    def _fields_fit_the_role(self) -> TokenIn:
        if self.team is not None and self.role != Role.MEMBER:
            raise ValueError("team applies only to role member")
        if self.job_id is not None and self.role != Role.JOB:
            raise ValueError("job_id applies only to role job")
        return self


class TokenOut(BaseModel):
    id: str
    role: Role
    team: str | None
    job_id: int | None
    name: str | None
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None


class TokenCreated(TokenOut):
    token: str = Field(description="The secret. Shown once: only its hash is stored.")


class WhoAmI(BaseModel):
    token_id: str
    role: Role
    team: str | None
    job_id: int | None


class MeasurementIn(BaseModel):
    """A measurement a job posts: `data` is checked against its kind's typed fields
    (`service.jobenv.check_measurement`) and stored as sent."""

    kind: MeasurementKind
    data: dict[str, Any]

    @model_validator(mode="after")
    def _typed(self) -> MeasurementIn:
        check_measurement(self.kind, self.data)
        return self
