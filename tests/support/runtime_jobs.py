"""Jobs that run the built-in runtime (`python -m workers.runtime`): its command line for the local
backend, and reading back what a job reported (its measurements, the steps of its heartbeats) and the
job itself as the API shows it."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from service.store.models import Measurement
from service.store.vocab import MeasurementKind
from tests.db_fixtures import Env

RUNTIME = ["python", "-m", "workers.runtime", "--heartbeat-every", "1", "--no-profile", "--no-track-memory"]


def measurements(env: Env, job_id: int, kind: MeasurementKind) -> list[dict[str, Any]]:
    with env.app.state.sessions() as session:
        rows = session.scalars(select(Measurement).where(Measurement.job_id == job_id, Measurement.kind == kind)
                               .order_by(Measurement.id))
        return [dict(m.data) for m in rows]


def beats(env: Env, job_id: int) -> list[int]:
    return [int(m["step"]) for m in measurements(env, job_id, MeasurementKind.HEARTBEAT)]


def job(env: Env, job_id: int, admin: dict[str, str]) -> dict[str, Any]:
    return env.client.get(f"/v1/jobs/{job_id}", headers=admin).json()  # type: ignore[no-any-return]
