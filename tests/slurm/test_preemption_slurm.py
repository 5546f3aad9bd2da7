"""Preemption on the real Slurm cluster: a two-rank runtime job in the default (preemptible, REQUEUE)
partition is preempted, either by a job in the higher-tier `urgent` partition on its node (Slurm requeues
the same job under the same id and folder) or through `Dispatcher.preempt` (`scancel`: the Slurm job ends,
and the next attempt is a fresh sbatch); Slurm signals it, the runtime checkpoints within KillWait into
the job's checkpoint folder, the next run resumes from it and ends with the spec's steps, the heartbeats
1..N each once."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from service.store.vocab import MeasurementKind
from tests.db_fixtures import Env
from tests.runtime.harness import spec_dict
from tests.slurm.conftest import URGENT, sacct_states
from tests.support.runtime_jobs import beats, job, measurements
from workers.backends.slurm import SlurmBackend
from workers.dispatch.context import DispatcherConfig
from workers.dispatcher import Dispatcher

STEPS = 60
#: Slurm's own preemption can come tens of seconds after the urgent job is submitted (its scheduler's
#: next pass, on a busy machine): a run of 60 steps (about 12 s) had then ended, and its requeue ran
#: every step again. This run outlasts that.
URGENT_STEPS = 400
RUNTIME = ["python", "-m", "workers.runtime", "--heartbeat-every", "1", "--no-profile", "--no-track-memory",
           "--timeout-s", "120"]
sqlite_only = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)



@sqlite_only
@pytest.mark.parametrize("by", ["urgent-partition", "dispatcher"])
def test_a_preempted_slurm_job_resumes_from_its_checkpoint(env: Env, admin: dict[str, str], live: str,
                                                           partition: str, tmp_path: Path, by: str) -> None:
    steps = URGENT_STEPS if by == "urgent-partition" else STEPS
    spec = {**spec_dict(2, steps=steps), "entrypoint": {"command": RUNTIME},
            "backend": {"kind": "slurm", "partition": partition}}
    job_id = env.client.post("/v1/jobs", json=spec, headers=admin).json()["id"]
    dispatcher = Dispatcher(env.app.state.sessions, {"slurm": SlurmBackend(folder=tmp_path / "slurm",
                                                                           partition=partition)},
                            DispatcherConfig(api_url=live, retry_backoff_s=0.1, max_attempts=1))
    deadline = time.monotonic() + 240
    while not beats(env, job_id) or beats(env, job_id)[-1] < 2:
        assert time.monotonic() < deadline, f"no heartbeat; job is {job(env, job_id, admin)['status']}"
        dispatcher.run_once()
        time.sleep(0.2)
    attempt = job(env, job_id, admin)["attempts"][0]
    slurm_id, node = attempt["backend_id"], attempt["nodes"][0]
    if by == "urgent-partition":  # needs 3 of the node's 4 CPUs: the job's 2 must go
        subprocess.run(["sbatch", "-o", "/dev/null", "-p", URGENT, "-N1", "-w", node, "--cpus-per-task=3",
                        "-J", "shardctl-test-urgent-preempt", "-t", "1", "--wrap", "sleep 2"],
                       check=True, capture_output=True)
    else:
        dispatcher.preempt(job_id, by=777, reason="a higher-priority job needs the node")

    deadline = time.monotonic() + 300
    while job(env, job_id, admin)["status"] not in {"SUCCEEDED", "FAILED", "CANCELLED"}:
        assert time.monotonic() < deadline, f"job stuck in {job(env, job_id, admin)['status']}"
        dispatcher.run_once()
        time.sleep(0.3)
    final = job(env, job_id, admin)
    assert final["status"] == "SUCCEEDED", [{k: a.get(k) for k in ("number", "backend_id", "status", "failure",
                                                                  "exit_code", "exit_reason", "log_tail")}
                                            for a in final["attempts"]]
    first, second = final["attempts"]  # the preempted run is not counted (max_attempts=1)
    assert first["failure"] == "preempted" and first["backend_id"] == slurm_id
    assert second["status"] == "SUCCEEDED"
    deadline = time.monotonic() + 30
    while (states := sacct_states(second["backend_id"]))[-1] != "COMPLETED" and time.monotonic() < deadline:
        time.sleep(0.5)  # sacct lags the controller a little
    if by == "urgent-partition":  # Slurm's own preemption requeues the same job: a new attempt of it
        assert second["backend_id"] == slurm_id and states[0] == "PREEMPTED" and states[-1] == "COMPLETED"
    else:  # shardctl's ends it for good; the next attempt is one fresh sbatch, which ran once
        assert second["backend_id"] != slurm_id and states == ["COMPLETED"]
        assert sacct_states(slurm_id) == ["CANCELLED"]
    notices = [e for e in env.client.get(f"/v1/jobs/{job_id}/events", headers=admin).json()
               if e["kind"] == "job.preempted"]  # who and why, once
    assert len(notices) == 1
    if by == "dispatcher":
        assert notices[0]["data"]["by"] == 777 and "higher-priority" in notices[0]["data"]["reason"]
    else:
        assert notices[0]["data"]["by_backend"] == "slurm" and notices[0]["data"]["reason"].startswith("preempted")
    assert beats(env, job_id) == list(range(1, steps + 1))  # steps continue from the checkpoint: none twice
    reports = measurements(env, job_id, MeasurementKind.REPORT)
    assert [r["status"] for r in reports] == ["preempted", "succeeded"]
    assert reports[-1]["start_step"] >= 2 and reports[-1]["start_step"] + reports[-1]["steps"] == steps
