"""The dispatcher on the real local backend, for tests that drive jobs through the API: a one-process
job, a dispatcher over a folder, and a loop that runs it until the job reaches a status."""

from __future__ import annotations

import time
from pathlib import Path

from service.store.db import make_engine, make_sessionmaker
from tests.db_fixtures import Env
from tests.specs import tiny
from workers.backends.local import LocalBackend
from workers.dispatch.context import DispatcherConfig
from workers.dispatcher import Dispatcher

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def one_process(command: str, **extra: object) -> dict:  # type: ignore[type-arg]
    """A single-process local job running `python -c command`."""
    return tiny(resources={"gpus_per_node": 1}, entrypoint={"command": ["python", "-c", command]}, **extra)


def make_dispatcher(env: Env, folder: Path, api_url: str | None = None, **config: object) -> Dispatcher:
    sessions = make_sessionmaker(make_engine(env.url))
    return Dispatcher(sessions, {"local": LocalBackend(folder)},
                      DispatcherConfig(api_url=api_url, retry_backoff_s=0.1, **config))  # type: ignore[arg-type]


def drive(env: Env, dispatcher: Dispatcher, job_id: int, admin: dict[str, str], until: set[str] = TERMINAL,
          timeout: float = 120) -> dict:  # type: ignore[type-arg]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dispatcher.run_once()
        job = env.client.get(f"/v1/jobs/{job_id}", headers=admin).json()
        if job["status"] in until:
            return job  # type: ignore[no-any-return]
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} stuck in {job['status']}")
