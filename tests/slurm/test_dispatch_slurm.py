"""Through the API and the dispatcher onto the real local Slurm cluster: a 2-node job to SUCCEEDED with
both nodes in its attempt, a program error to FAILED with exit code and log tail, a cancel that sacct
confirms, and crash safety (SIGKILL at both dangerous points: each attempt exists in sacct exactly once).

The heavy cases run on SQLite (the embedded default); the runtime case runs on both databases."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from service.store.models import Job
from tests.db_fixtures import Env
from tests.slurm.conftest import sacct_count_by_name, sacct_states
from tests.support.slurm_dispatch import drive, events, make_dispatcher, slurm_job
from workers.dispatch.context import FAILPOINT_ENV

ROOT = Path(__file__).resolve().parents[2]
sqlite_only = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def test_a_two_node_runtime_job_succeeds_with_both_nodes_in_its_attempt(
        env: Env, admin: dict[str, str], live: str, partition: str, tmp_path: Path) -> None:
    # The runtime reads the job contract (service.jobenv): the plan and the out dir come in the environment.
    runtime = ["python", "-m", "workers.runtime", "--no-profile", "--timeout-s", "120"]
    job_id = env.client.post("/v1/jobs", json=slurm_job(partition, runtime), headers=admin).json()["id"]
    job = drive(env, make_dispatcher(env, tmp_path / "slurm", partition, api_url=live), job_id, admin, timeout=300)
    assert job["status"] == "SUCCEEDED", events(env, job_id, admin)[-1]
    attempt = job["attempts"][0]
    assert attempt["backend_name"] == f"shardctl-{job_id}-1" and attempt["exit_code"] == 0
    assert attempt["nodes"] == ["node1", "node2"]
    assert sacct_states(attempt["backend_id"]) == ["COMPLETED"]


@sqlite_only
def test_a_failing_program_fails_the_job_with_exit_code_and_log_tail(
        env: Env, admin: dict[str, str], partition: str, tmp_path: Path) -> None:
    command = ["python", "-c", "import sys; print('loss is nan', flush=True); sys.exit(3)"]
    job_id = env.client.post("/v1/jobs", json=slurm_job(partition, command), headers=admin).json()["id"]
    job = drive(env, make_dispatcher(env, tmp_path / "slurm", partition), job_id, admin)
    assert job["status"] == "FAILED" and len(job["attempts"]) == 1
    failed = events(env, job_id, admin)[-1]
    assert failed["data"]["exit_code"] == 3 and failed["data"]["failure"] == "program_error"
    assert "loss is nan" in failed["data"]["log_tail"]
    assert job["attempts"][0]["nodes"] == ["node1", "node2"]


@sqlite_only
def test_cancel_reaches_slurm_and_sacct_agrees(env: Env, admin: dict[str, str], partition: str,
                                               tmp_path: Path) -> None:
    command = ["python", "-c", "import time; time.sleep(300)"]
    job_id = env.client.post("/v1/jobs", json=slurm_job(partition, command), headers=admin).json()["id"]
    dispatcher = make_dispatcher(env, tmp_path / "slurm", partition)
    drive(env, dispatcher, job_id, admin, until={"RUNNING"})
    assert env.client.post(f"/v1/jobs/{job_id}/cancel", headers=admin).json()["status"] == "CANCELLING"
    job = drive(env, dispatcher, job_id, admin, timeout=60)
    assert job["status"] == "CANCELLED"
    assert [e["kind"] for e in events(env, job_id, admin)][-2:] == ["job.cancelling", "job.cancelled"]
    assert sacct_states(job["attempts"][0]["backend_id"]) == ["CANCELLED"]


@sqlite_only
@pytest.mark.parametrize("point", ["after-submitting-commit", "after-backend-answer"])
def test_a_dispatcher_killed_mid_submission_never_submits_twice(
        env: Env, admin: dict[str, str], partition: str, tmp_path: Path, point: str) -> None:
    command = ["python", "-c", "print('ran', flush=True)"]
    job_id = env.client.post("/v1/jobs", json=slurm_job(partition, command), headers=admin).json()["id"]
    crash = subprocess.run(
        [sys.executable, "-m", "service.cli.main", "worker", "--once"], cwd=ROOT, timeout=120,
        env={**os.environ, FAILPOINT_ENV: point, "SHARDCTL_DATABASE_URL": env.url,
             "SHARDCTL_DATA_DIR": str(tmp_path), "SHARDCTL_DISPATCHER_LEASE_S": "1"},
        capture_output=True, text=True)
    assert crash.returncode == -9, crash.stderr  # SIGKILL at the failpoint
    with env.app.state.sessions.begin() as session:
        assert session.get(Job, job_id).status == "SUBMITTING"
    name = f"shardctl-{job_id}-1"
    time.sleep(1.2)  # the dead dispatcher's lease runs out
    # the restarted dispatcher uses the same folder as `shardctl worker` (data dir / "slurm")
    job = drive(env, make_dispatcher(env, tmp_path / "slurm", partition, lease_s=1), job_id, admin)
    assert job["status"] == "SUCCEEDED", events(env, job_id, admin)[-1]
    assert [a["backend_name"] for a in job["attempts"]] == [name]
    adopted = [e for e in events(env, job_id, admin) if e["kind"] == "job.pending"]
    assert adopted[0]["data"]["adopted"] is (point == "after-backend-answer")
    deadline = time.monotonic() + 20
    workdir = tmp_path / "slurm" / name
    while sacct_count_by_name(name, workdir) == 0 and time.monotonic() < deadline:
        time.sleep(0.3)
    assert sacct_count_by_name(name, workdir) == 1  # exactly once on the backend
    with env.app.state.sessions.begin() as session:
        assert session.scalars(select(Job.status).where(Job.id == job_id)).one() == "SUCCEEDED"
