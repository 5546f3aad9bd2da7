"""The contract between the control plane and a running job: what each rank is given, by name, and
what it reports back.

Every backend ships `JobEnv.variables()` and `JobEnv.secrets()` to every rank as environment
variables, whatever way it has to do so (a process environment, an sbatch environment, a
ConfigMap and a Secret); the runtime reads them back with `JobEnv.from_environ`. These names are
the only `SHARDCTL_*` variables a job is given; nothing else writes or reads them.

The plan travels whole, exactly as the API stored and showed it: it carries the resolved model
shape and the training settings, so a job needs nothing else to run it.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, FieldSerializationInfo, SecretStr, ValidationError, field_serializer

from service.planner.result import Plan

JOB_ID = "SHARDCTL_JOB_ID"
ATTEMPT = "SHARDCTL_ATTEMPT"
PLAN = "SHARDCTL_PLAN_JSON"
OUT_DIR = "SHARDCTL_OUT_DIR"
API_URL = "SHARDCTL_URL"
TOKEN = "SHARDCTL_JOB_TOKEN"  # the one secret: backends keep it out of previews and in their secret stores
LOG_LEVEL = "SHARDCTL_LOG"  # optional, set by hand: the runtime's log level (default INFO)
CHECKPOINT_DIR = "SHARDCTL_CHECKPOINT_DIR"  # optional: checkpoints across attempts (default OUT_DIR/checkpoints)
#: The exit code of a job that stopped because it was told to (SIGTERM, Slurm's preemption signal) after
#: saving a checkpoint: EX_TEMPFAIL of sysexits.h, "try again later". Backends report it as `preempted`.
PREEMPTED_EXIT_CODE = 75

REVEAL_KEY = "reveal_secrets"
#: Serialisation context that writes the token in clear, for a file only the job reads.
REVEAL = {REVEAL_KEY: True}


class MeasurementKind(StrEnum):
    """What a job reports about itself (`POST /v1/jobs/{id}/measurements` with its token)."""

    HEARTBEAT = "heartbeat"
    REPORT = "report"
    PROFILE = "profile"


class _Door(BaseModel):
    """What the server reads of a measurement, typed; every other field is the job's own and kept as sent."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)


class HeartbeatData(_Door):
    """A heartbeat's `data`: the step it was sent at, the loss and the throughput, each optional."""

    step: int | None = Field(None, ge=0)
    loss: float | None = None
    tokens_per_s: float | None = None


class ReportedError(_Door):
    rank: int | None = None
    type: str = ""
    message: str = ""


class ReportData(_Door):
    """A final report's `data` (`workers.runtime.report.Report`), as far as the server reads it."""

    status: str | None = None
    start_step: int | None = Field(None, ge=0)
    losses: list[float | None] = Field(default_factory=list)
    predicted: dict[str, float | None] | None = None
    measured: dict[str, float | None] = Field(default_factory=dict)
    ratios: dict[str, float | None] = Field(default_factory=dict)
    error: ReportedError | None = None


#: The typed model a measurement's `data` must satisfy, per kind (a profile is read leniently, as
#: `service.profiles.models.ProfileSummary`, and shown only when it is one).
MEASUREMENT_DATA: dict[MeasurementKind, type[BaseModel] | None] = {
    MeasurementKind.HEARTBEAT: HeartbeatData, MeasurementKind.REPORT: ReportData, MeasurementKind.PROFILE: None}


def check_measurement(kind: MeasurementKind, data: Mapping[str, object]) -> None:
    """`ValueError` naming the first field of `data` that the server cannot read as the contract says
    (`data.step: ...`); nothing for data it reads (fields it does not know are the job's own)."""
    model = MEASUREMENT_DATA[kind]
    if model is None:
        return
    try:
        model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in ("data", *first["loc"]))
        raise ValueError(f"{where}: {first['msg']} (a {kind} measurement; see docs/runtime.md)") from None


class JobEnvError(ValueError):
    """The environment does not carry a usable job contract (a variable missing or malformed)."""


class JobEnv(BaseModel):
    """What one attempt of a job is given. `out_dir` is where it writes; the backend sets it."""

    model_config = ConfigDict(frozen=True)

    job_id: int = Field(ge=0)
    attempt: int = Field(ge=1)
    plan: Plan
    api_url: str | None = Field(None, description="Where the job reports; None: it reports nowhere.")
    token: SecretStr | None = Field(None, description="The job-scoped token for its reports.")
    out_dir: str | None = None
    checkpoint_dir: str | None = Field(None, description="Where checkpoints live, shared by every attempt of the"
                                       " job so the next one resumes; None: `out_dir`/checkpoints.")

    @field_serializer("token", when_used="json")
    def _token(self, token: SecretStr | None, info: FieldSerializationInfo) -> str | None:
        """Masked in JSON, unless the caller hands the request on to the job itself
        (`model_dump_json(context=REVEAL)`, as the local backend's request file does)."""
        if token is None:
            return None
        return token.get_secret_value() if (info.context or {}).get(REVEAL_KEY) else str(token)

    def variables(self) -> dict[str, str]:
        """The plain variables (never the token)."""
        env = {JOB_ID: str(self.job_id), ATTEMPT: str(self.attempt), PLAN: self.plan.model_dump_json()}
        if self.api_url:
            env[API_URL] = self.api_url
        if self.out_dir:
            env[OUT_DIR] = self.out_dir
        if self.checkpoint_dir:
            env[CHECKPOINT_DIR] = self.checkpoint_dir
        return env

    def secrets(self) -> dict[str, str]:
        """The secret variables: the job token, when there is one."""
        return {TOKEN: self.token.get_secret_value()} if self.token is not None else {}

    def environ(self) -> dict[str, str]:
        return {**self.variables(), **self.secrets()}

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> JobEnv:
        """Read the contract back in the job; `JobEnvError` names the variable that is wrong."""
        missing = [name for name in (JOB_ID, ATTEMPT, PLAN) if not environ.get(name)]
        if missing:
            raise JobEnvError(f"${', $'.join(missing)} not set: this process was not started by a shardctl backend"
                              " (run `python -m workers.runtime --plan plan.json --out DIR` by hand)")
        try:
            plan = Plan.model_validate_json(environ[PLAN])
        except ValidationError as exc:
            raise JobEnvError(f"${PLAN} is not a plan: {exc.errors()[0]['msg']}") from exc
        try:
            return cls(job_id=int(environ[JOB_ID]), attempt=int(environ[ATTEMPT]), plan=plan,
                       api_url=environ.get(API_URL) or None, token=environ.get(TOKEN) or None,
                       out_dir=environ.get(OUT_DIR) or None, checkpoint_dir=environ.get(CHECKPOINT_DIR) or None)
        except (ValueError, ValidationError) as exc:
            raise JobEnvError(f"${JOB_ID} and ${ATTEMPT} must be integers: {exc}") from exc
