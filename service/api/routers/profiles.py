"""Profile summaries of a job: posted by the runtime, or analysed here from uploaded trace files."""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, File, Request, Response, UploadFile
from pydantic import BaseModel, Field, ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from service.api.analysis import AnalysisBusy
from service.api.deps import Caller, Db, Reporter, Unstorable, check_storable
from service.api.errors import ApiError
from service.api.routers.jobs import ERRORS, JobId, rendered, storable
from service.profiles import ProfileSummary, TraceError, analyze_traces
from service.store.jobs import add_measurement, visible_job
from service.store.models import Job, Measurement
from service.store.states import add_event
from service.store.tokens import Principal
from service.store.vocab import EventKind, JobStatus, MeasurementKind, Role

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/jobs", tags=["profiles"])
MAX_FILES = 64
CHUNK = 1 << 20


class ProfileOut(BaseModel):
    at: datetime
    summary: dict[str, Any]


class AnalysisAccepted(BaseModel):
    upload: str = Field(description="Upload id; the summary appears in GET .../profiles when analysed.")
    files: int
    bytes: int


@router.post("/{job_id}/profiles", response_model=ProfileOut, status_code=201, responses=ERRORS,
             summary="Store a ProfileSummary (job token or admin)")
def post_profile(job_id: JobId, summary: ProfileSummary, principal: Reporter, db: Db, request: Request) -> Response:
    """A JSON body is a summary. Trace files sent here as `multipart/form-data` are handled exactly as
    by `POST /v1/jobs/{job_id}/profiles/traces` (202, analysed in the background)."""
    data = summary.model_dump(mode="json")
    storable(data)  # "NaN" or "Infinity" as strings are floats to pydantic, and no JSON number
    with db.begin() as session:
        job = visible_job(session, principal, job_id)
        check_room_for_a_profile(session, principal, job, request.app.state.settings.max_profiles_per_job,
                                 uploading=False)
        row = add_measurement(session, principal, job, MeasurementKind.PROFILE, data)
        return rendered(ProfileOut(at=row.at, summary=row.data), 201)


@router.post("/{job_id}/profiles/traces", response_model=AnalysisAccepted, status_code=202, responses=ERRORS,
             summary="Upload one PyTorch trace per rank (plain or gzip JSON); analysed in the background")
def post_traces(job_id: JobId, principal: Reporter, db: Db, request: Request,
                files: Annotated[list[UploadFile], File(description="One Chrome/Kineto trace per rank.",
                                                        min_length=1, max_length=MAX_FILES)]
                ) -> AnalysisAccepted:
    """Each file is copied to the data directory (at most `SHARDCTL_MAX_TRACE_BYTES` each, 512 MiB by
    default, and 64 files). The whole request body is at most `SHARDCTL_MAX_UPLOAD_BYTES` (2 GiB by
    default), counted as it arrives and read only after the token is checked; the multipart parser
    spools it to temporary files first. The analysis runs in a background thread, at most
    `SHARDCTL_MAX_TRACE_EVENTS` complete events per rank, and stores its summary, or a
    `job.profile_failed` event with the reason. Nothing is kept of a refused upload."""
    settings = request.app.state.settings
    with db.begin() as session:
        check_room_for_a_profile(session, principal, visible_job(session, principal, job_id),
                                 settings.max_profiles_per_job, uploading=True)
    if not 0 < len(files) <= MAX_FILES:
        raise ApiError(422, "validation_error", f"send 1 to {MAX_FILES} trace files, one per rank")
    upload = uuid.uuid4().hex[:12]
    folder: Path = settings.data_dir / "profiles" / str(job_id) / upload
    settings.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    for level in (folder.parent.parent, folder.parent, folder):  # owner-only: traces are the job's data
        level.mkdir(mode=0o700, exist_ok=True)
    total, paths = 0, []
    try:
        for index, item in enumerate(files):
            suffix = ".json.gz" if (item.filename or "").endswith(".gz") else ".json"
            path = folder / f"trace-{index}{suffix}"
            size = 0
            with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
                while chunk := item.file.read(CHUNK):
                    size += len(chunk)
                    if size > settings.max_trace_bytes:
                        raise ApiError(413, "too_large", f"{item.filename}: over {settings.max_trace_bytes} bytes; "
                                       "upload it gzip-compressed (.json.gz) or profile fewer steps")
                    out.write(chunk)
            total += size
            paths.append(path)
    except ApiError:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    try:
        request.app.state.analyses.submit(
            lambda: _analyse(db, principal, job_id, paths, folder, settings.max_trace_events))
    except AnalysisBusy as exc:
        shutil.rmtree(folder, ignore_errors=True)
        raise ApiError(503, "analysis_busy", f"{exc}: upload again in a minute, or analyse the traces offline"
                       " (`shardctl profile analyze`) and post the summary", headers={"Retry-After": "60"}) from exc
    return AnalysisAccepted(upload=upload, files=len(paths), bytes=total)


def check_room_for_a_profile(session: Session, principal: Principal, job: Job, limit: int, *,
                             uploading: bool) -> None:
    """409 when the job already holds `limit` profile summaries, or, for trace uploads, when a job
    token's job is not running (its token uploads while it runs; an admin may upload any time)."""
    if uploading and principal.role == Role.JOB and job.status != JobStatus.RUNNING:
        raise ApiError(409, "conflict", f"job {job.id} is {job.status.value}: a job token uploads profiles while"
                       " its job runs; an admin may add them later")
    held = session.scalar(select(func.count()).select_from(Measurement).where(
        Measurement.job_id == job.id, Measurement.kind == MeasurementKind.PROFILE)) or 0
    if held >= limit:
        raise ApiError(409, "conflict", f"job {job.id} already holds {held} profile summaries (the most one job"
                       " may hold: SHARDCTL_MAX_PROFILES_PER_JOB)")


def _predicted_comm(db: sessionmaker[Session], job_id: int) -> float | None:
    """The job's plan's exposed-communication share; None when the job or a usable plan is gone."""
    with db.begin() as session:
        job = session.get(Job, job_id)
        if job is None:
            return None
        try:
            return job.plan.time.exposed_comm_fraction
        except ValidationError:  # a stored plan this version cannot read
            return None


def _without_folder(message: str, folder: Path) -> str:
    """`message` with the server's upload folder left out: a member sees the trace's file name only."""
    return message.replace(f"{folder}{os.sep}", "").replace(str(folder), "the upload")


def _analyse(db: sessionmaker[Session], principal: Principal, job_id: int, paths: list[Path], folder: Path,
             max_events: int) -> None:
    """Analyse, store the summary; on any failure record `job.profile_failed` with the reason. The
    uploaded files are deleted either way."""
    try:
        predicted = _predicted_comm(db, job_id)
        summary = analyze_traces(paths, predicted_comm_fraction=predicted, max_events=max_events)
        data = summary.model_dump(mode="json")
        check_storable(data)  # a summary no response could carry back would break every read of the job
        outcome: tuple[str, Any] = ("profile", data)
    except Unstorable as exc:
        outcome = ("failed", f"the analysis produced a summary that cannot be stored ({exc})")
    except TraceError as exc:
        outcome = ("failed", _without_folder(str(exc), folder))
    except Exception as exc:  # the thread is the only one that can still tell the user
        log.exception("profile analysis of job %s failed", job_id)
        outcome = ("failed", _without_folder(f"the analysis failed unexpectedly ({type(exc).__name__}: {exc})",
                                             folder))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    with db.begin() as session:
        job = session.get(Job, job_id)
        if job is None:
            return
        if outcome[0] == "profile":
            add_measurement(session, principal, job, MeasurementKind.PROFILE, outcome[1])
        else:
            add_event(session, job, actor=principal.actor, kind=EventKind.PROFILE_FAILED, message=outcome[1])


@router.get("/{job_id}/profiles", response_model=list[ProfileOut], responses=ERRORS,
            summary="The job's profile summaries, newest first")
def get_profiles(job_id: JobId, principal: Caller, db: Db) -> list[ProfileOut]:
    with db.begin() as session:
        job = visible_job(session, principal, job_id)
        rows = session.scalars(select(Measurement)
                               .where(Measurement.job_id == job.id, Measurement.kind == MeasurementKind.PROFILE)
                               .order_by(Measurement.id.desc()))
        return [ProfileOut(at=r.at, summary=r.data) for r in rows]
