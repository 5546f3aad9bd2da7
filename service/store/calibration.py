"""Calibration in the store: samples read incrementally from finished runs' reports, and the fit.

Each succeeded job's first plausible `report` measurement becomes one `CalibrationSample`: what the
run measured against the prediction of the plan the server stored for the job
(`service.planner.calibration.sample_of`), under the job's team. `refresh` reads only the reports
added since its cursor, so its cost follows what is new, not how many jobs the store holds;
`current` fits from at most `window` newest samples per GPU kind and family, and keeps the fit in
memory until a new sample arrives. A report committed with a smaller id after the cursor passed it
(two writers racing on PostgreSQL) is not read: one sample fewer, never a wrong one.

**Scope.** A job's program holds its token and can post any measurement, so one team's reports must
not move another team's plans. With the scope `team` (the default, `SHARDCTL_CALIBRATION_SCOPE`) a
team's plans use the factors fitted from its own runs only; with `all` an admin has said that every
team's runs are trusted, and every plan uses one fit of them all.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any, Literal

from sqlalchemy import ColumnElement, func, select, true
from sqlalchemy.orm import Session, sessionmaker

from service.jobenv import MeasurementKind
from service.planner.calibration import (
    DEFAULT_MIN_RUNS,
    DEFAULT_WINDOW,
    Calibration,
    ReportedRun,
    Sample,
    fit,
    sample_of,
)
from service.planner.result import Plan
from service.store.calibration_models import CalibrationCursor, CalibrationSample
from service.store.db import upsert_into
from service.store.models import Job, Measurement, Team

log = logging.getLogger(__name__)
BATCH = 1000
_CURSOR_ID = 1


def _cursor(session: Session, *, lock: bool) -> CalibrationCursor:
    stmt = select(CalibrationCursor).where(CalibrationCursor.id == _CURSOR_ID)
    if lock:  # read again under the lock: another writer may have moved it since
        stmt = stmt.with_for_update().execution_options(populate_existing=True)
    row = session.scalars(stmt).first()
    if row is None:
        session.execute(upsert_into(session, CalibrationCursor).values(id=_CURSOR_ID, scanned_through=0)
                        .on_conflict_do_nothing(index_elements=["id"]))
        row = session.scalars(stmt).one()
    return row


def refresh(session: Session) -> int:
    """Read the reports added since the last refresh into samples; returns how many samples were
    added. Writes (and locks the cursor row) only when there is a new report. A job gives at most
    one sample, from its first report that makes one (a job's program holds its token and could post
    many); a report that is not one, or not plausible (`sample_of`), gives none."""
    cursor = _cursor(session, lock=False)
    newer = select(func.min(Measurement.id)).where(
        Measurement.id > cursor.scanned_through, Measurement.kind == MeasurementKind.REPORT)
    if session.scalar(newer) is None:
        return 0
    cursor = _cursor(session, lock=True)
    added = 0
    while True:
        rows = session.execute(
            select(Measurement.id, Measurement.job_id, Measurement.data, Job.gpu, Job.plan, Job.team_id)
            .join(Job, Job.id == Measurement.job_id)
            .where(Measurement.id > cursor.scanned_through, Measurement.kind == MeasurementKind.REPORT)
            .order_by(Measurement.id).limit(BATCH)).all()
        if not rows:
            break
        values: list[dict[str, Any]] = []
        sampled = set(session.scalars(select(CalibrationSample.job_id).where(
            CalibrationSample.job_id.in_({row[1] for row in rows}))))
        for mid, job_id, data, gpu, plan, team_id in rows:
            sample = _sample(data, gpu, plan) if job_id not in sampled else None
            if sample is not None:
                sampled.add(job_id)
                values.append({"measurement_id": mid, "job_id": job_id, "team_id": team_id, **sample.model_dump()})
        if values:
            session.execute(upsert_into(session, CalibrationSample).values(values)
                            .on_conflict_do_nothing(index_elements=["measurement_id"]))
            added += len(values)
        cursor.scanned_through = rows[-1][0]
        session.flush()
        if len(rows) < BATCH:
            break
    return added


def _sample(data: Mapping[str, Any], gpu: str, plan: Plan) -> Sample | None:
    report = ReportedRun.parse(data)
    return None if report is None else sample_of(report, plan, gpu)


#: `team`: a team's plans use its own runs only; `all`: every team's runs, one fit for all.
Scope = Literal["team", "all"]


def _of_team(team: str | None) -> ColumnElement[bool]:
    """The samples of team `team`'s jobs (none when there is no such team); every sample for None."""
    if team is None:
        return true()
    return CalibrationSample.team_id == select(Team.id).where(Team.name == team).scalar_subquery()


def samples(session: Session, *, team: str | None = None, window: int = DEFAULT_WINDOW) -> list[Sample]:
    """The newest `window` samples of each GPU kind and family, oldest first within each: those of
    team `team`'s jobs, or of every team's when None."""
    order = func.row_number().over(partition_by=(CalibrationSample.gpu, CalibrationSample.family),
                                   order_by=CalibrationSample.measurement_id.desc()).label("n")
    inner = select(CalibrationSample, order).where(_of_team(team)).subquery()
    rows = session.execute(select(inner).where(inner.c.n <= window)
                           .order_by(inner.c.gpu, inner.c.family, inner.c.measurement_id)).mappings()
    return [Sample(gpu=r["gpu"], family=r["family"], predicted_step_s=r["predicted_step_s"],
                   measured_step_s=r["measured_step_s"], predicted_peak_bytes=r["predicted_peak_bytes"],
                   measured_peak_bytes=r["measured_peak_bytes"]) for r in rows]


_fits: dict[tuple[str, str | None, int, int], tuple[tuple[int, int], Calibration]] = {}
_fits_lock = threading.Lock()


def current(session: Session, *, team: str | None = None, min_runs: int = DEFAULT_MIN_RUNS,
            window: int = DEFAULT_WINDOW) -> Calibration:
    """The calibration of team `team`'s runs measured so far, or of every team's when None (refreshing
    first). The fit is remembered per database and team and reused until one of its samples is added."""
    refresh(session)
    newest = session.execute(select(func.max(CalibrationSample.measurement_id), func.count())
                             .select_from(CalibrationSample).where(_of_team(team))).one()
    version = (int(newest[0] or 0), int(newest[1]))
    key = (str(session.get_bind().engine.url), team, min_runs, window)
    with _fits_lock:
        held = _fits.get(key)
    if held is not None and held[0] == version:
        return held[1]
    calibration = fit(samples(session, team=team, window=window), min_runs=min_runs, window=window)
    with _fits_lock:
        _fits[key] = (version, calibration)
    return calibration


def version(calibration: Calibration) -> str:
    """A short digest of the factors: plans made under equal calibrations may be shared."""
    return hashlib.sha256(calibration.model_dump_json().encode()).hexdigest()[:16]


class CalibrationSource:
    """What planning for a team applies now: `current` and its `version` under the `scope`, read from
    the store at most once per `ttl_s` and team (planning many specs in a burst costs no query each;
    a new run counts within `ttl_s`)."""

    def __init__(self, sessions: sessionmaker[Session], *, min_runs: int = DEFAULT_MIN_RUNS,
                 scope: Scope = "team", ttl_s: float = 2.0) -> None:
        self.sessions, self.min_runs, self.scope, self.ttl_s = sessions, min_runs, scope, ttl_s
        self._lock = threading.Lock()
        self._held: dict[str | None, tuple[float, Calibration, str]] = {}

    def fitted_for(self, team: str) -> str | None:
        """Whose runs a plan of `team` is calibrated from: `team`, or None for every team's."""
        return team if self.scope == "team" else None

    def __call__(self, team: str) -> tuple[Calibration, str]:
        """The calibration a plan of `team` uses. Never raises: should the store fail to give one,
        planning goes on with the last one read (none at first: the model's own figures), and the
        failure is logged."""
        key = self.fitted_for(team)
        now = time.monotonic()
        with self._lock:
            held = self._held.get(key)
        if held is not None and now - held[0] < self.ttl_s:
            return held[1], held[2]
        try:
            with self.sessions.begin() as session:
                cal = current(session, team=key, min_runs=self.min_runs)
        except Exception:
            log.exception("calibration could not be read; planning without new measurements")
            cal = held[1] if held is not None else Calibration(min_runs=self.min_runs)
        pair = (cal, held[2] if held is not None and held[1] is cal else version(cal))
        with self._lock:
            self._held[key] = (now, *pair)
        return pair


__all__ = ["CalibrationSource", "Scope", "current", "refresh", "samples", "version"]
