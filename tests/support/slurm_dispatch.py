"""The dispatcher on the real local Slurm cluster, for tests that drive jobs through the API: a 2-node
job spec, a dispatcher over a folder, a loop that runs it until the job reaches a status, and the job's
events."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from service.store.db import make_engine, make_sessionmaker
from tests.db_fixtures import Env
from tests.specs import tiny
from workers.backends.slurm import SlurmBackend
from workers.dispatch.context import DispatcherConfig
from workers.dispatcher import Dispatcher

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def slurm_job(partition: str, command: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    """A 2-node CPU job (1 process per node) on the Slurm backend; the runtime when `command` is None."""
    sections: dict[str, Any] = {"resources": {"nodes": 2, "gpus_per_node": 1},
                                "backend": {"kind": "slurm", "partition": partition}}
    if command is not None:
        sections["entrypoint"] = {"command": command}
    return tiny(**sections, **extra)


def make_dispatcher(env: Env, folder: Path, partition: str, api_url: str | None = None,
                    **config: Any) -> Dispatcher:
    sessions = make_sessionmaker(make_engine(env.url))
    return Dispatcher(sessions, {"slurm": SlurmBackend(folder=folder, partition=partition)},
                      DispatcherConfig(api_url=api_url, retry_backoff_s=0.1, **config))


def drive(env: Env, dispatcher: Dispatcher, job_id: int, admin: dict[str, str], until: set[str] = TERMINAL,
          timeout: float = 180) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        dispatcher.run_once()
        job: dict[str, Any] = env.client.get(f"/v1/jobs/{job_id}", headers=admin).json()
        if job["status"] in until:
            return job
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} stuck in {job['status']}: {events(env, job_id, admin)}")
        time.sleep(0.3)


def events(env: Env, job_id: int, admin: dict[str, str]) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = env.client.get(f"/v1/jobs/{job_id}/events", headers=admin).json()
    return result
