"""Runs last: the 1-minute-limit job was submitted at the start of the session (conftest), because Slurm
enforces time limits only about every 30 s."""

from __future__ import annotations

import time
from typing import Any

from tests.slurm.conftest import TERMINAL, sacct_states, wait_for
from workers.backends.base import Handle, RunState
from workers.backends.slurm import SlurmBackend


def test_a_time_limit_kill_is_reported_as_timeout(backend: SlurmBackend, time_limit_job: Handle) -> None:
    obs = wait_for(backend, time_limit_job, lambda o: o.state in TERMINAL, timeout=150)
    assert obs.state == RunState.FAILED and obs.failure == "timeout", obs
    assert "time limit" in (obs.reason or "")
    assert time_limit_job.backend_id is not None and sacct_states(time_limit_job.backend_id) == ["TIMEOUT"]
    assert obs.log_tail is not None and "sleeping" in obs.log_tail


def test_a_time_limit_kill_fails_the_job_through_the_api_as_a_timeout(api_time_limit_job: dict[str, Any]) -> None:
    client, headers, job_id = (api_time_limit_job[k] for k in ("client", "headers", "job_id"))
    dispatcher = api_time_limit_job["dispatcher"]
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        dispatcher.run_once()
        job = client.get(f"/v1/jobs/{job_id}", headers=headers).json()
        if job["status"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
            break
        time.sleep(1)
    assert job["status"] == "FAILED", job["status"]
    last = client.get(f"/v1/jobs/{job_id}/events", headers=headers).json()[-1]
    assert last["data"]["failure"] == "timeout" and "time limit" in last["message"]
    assert len(job["attempts"]) == 1  # a time limit is not retried
    assert job["attempts"][0]["failure"] == "timeout" and "time limit" in job["attempts"][0]["exit_reason"]
    assert sacct_states(job["attempts"][0]["backend_id"]) == ["TIMEOUT"]
