"""The dispatcher against real databases and the real local backend: lifecycle, failures, cancel,
crash safety (SIGKILL at both dangerous points) and two replicas draining one queue."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from service.store.models import Attempt, Job
from tests.db_fixtures import Env
from tests.specs import tiny
from tests.support.dispatch import TERMINAL, drive, make_dispatcher, one_process
from workers.dispatch.context import FAILPOINT_ENV

ROOT = Path(__file__).resolve().parents[2]


def kinds(env: Env, job_id: int, admin: dict[str, str]) -> list[str]:
    return [e["kind"] for e in env.client.get(f"/v1/jobs/{job_id}/events", headers=admin).json()]


def test_a_job_runs_to_success_and_reports_back_with_its_own_token(env: Env, admin: dict[str, str], live: str,
                                                                   tmp_path: Path) -> None:
    report = ("import os, httpx; r = httpx.post(os.environ['SHARDCTL_URL'] + '/v1/jobs/' + os.environ["
              "'SHARDCTL_JOB_ID'] + '/measurements', json={'kind': 'report', 'data': {'rank': os.environ['RANK']}},"
              " headers={'Authorization': 'Bearer ' + os.environ['SHARDCTL_JOB_TOKEN']}); r.raise_for_status()")
    job_id = env.client.post("/v1/jobs", json=one_process(report), headers=admin).json()["id"]
    job = drive(env, make_dispatcher(env, tmp_path, api_url=live), job_id, admin)
    assert job["status"] == "SUCCEEDED", kinds(env, job_id, admin)
    assert kinds(env, job_id, admin) == ["job.queued", "job.submitting", "job.pending", "job.running",
                                         "job.report", "job.succeeded"] or kinds(env, job_id, admin) == [
        "job.queued", "job.submitting", "job.pending", "job.report", "job.succeeded"]
    assert job["measurements"]["report"]["data"] == {"rank": "0"}
    attempt = job["attempts"][0]
    assert attempt["backend_name"] == f"shardctl-{job_id}-1" and attempt["exit_code"] == 0 and attempt["nodes"]


def test_the_programs_own_error_fails_the_job_with_exit_code_and_log_tail(env: Env, admin: dict[str, str],
                                                                          tmp_path: Path) -> None:
    job_id = env.client.post("/v1/jobs", json=one_process("import sys; print('loss is nan'); sys.exit(3)"),
                             headers=admin).json()["id"]
    job = drive(env, make_dispatcher(env, tmp_path), job_id, admin)
    assert job["status"] == "FAILED" and len(job["attempts"]) == 1  # a program error is not retried
    failed = env.client.get(f"/v1/jobs/{job_id}/events", headers=admin).json()[-1]
    assert failed["data"]["exit_code"] == 3 and "loss is nan" in failed["data"]["log_tail"]


def test_a_lost_run_is_retried_as_a_new_attempt(env: Env, admin: dict[str, str], tmp_path: Path) -> None:
    job_id = env.client.post("/v1/jobs", json=one_process("import time; time.sleep(60)"), headers=admin).json()["id"]
    dispatcher = make_dispatcher(env, tmp_path)
    drive(env, dispatcher, job_id, admin, until={"RUNNING"})
    state = (tmp_path / f"shardctl-{job_id}-1" / "state.json").read_text()
    import json
    import signal

    os.killpg(json.loads(state)["pgid"], signal.SIGKILL)  # the machine "dies" with the job on it
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        dispatcher.run_once()
        job = env.client.get(f"/v1/jobs/{job_id}", headers=admin).json()
        if len(job["attempts"]) == 2 and job["status"] == "RUNNING":
            break
        time.sleep(0.1)
    assert [a["backend_name"] for a in job["attempts"]] == [f"shardctl-{job_id}-1", f"shardctl-{job_id}-2"]
    assert "job.queued" in kinds(env, job_id, admin)[2:]  # back to the queue, then submitted again
    assert job["attempts"][0]["exit_reason"].startswith("the local supervisor died")
    env.client.post(f"/v1/jobs/{job_id}/cancel", headers=admin)
    assert drive(env, dispatcher, job_id, admin)["status"] == "CANCELLED"


def test_cancel_reaches_the_backend(env: Env, admin: dict[str, str], tmp_path: Path) -> None:
    job_id = env.client.post("/v1/jobs", json=one_process("import time; time.sleep(120)"), headers=admin).json()["id"]
    dispatcher = make_dispatcher(env, tmp_path)
    drive(env, dispatcher, job_id, admin, until={"RUNNING"})
    assert env.client.post(f"/v1/jobs/{job_id}/cancel", headers=admin).json()["status"] == "CANCELLING"
    job = drive(env, dispatcher, job_id, admin)
    assert job["status"] == "CANCELLED"
    assert kinds(env, job_id, admin)[-2:] == ["job.cancelling", "job.cancelled"]
    import json

    pid = json.loads((tmp_path / f"shardctl-{job_id}-1" / "state.json").read_text())["pid"]
    time.sleep(0.5)
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1]


def test_an_unconfigured_backend_fails_the_job_with_the_reason(env: Env, admin: dict[str, str],
                                                               tmp_path: Path) -> None:
    job_id = env.client.post("/v1/jobs", json=tiny(backend={"kind": "kubernetes"}), headers=admin).json()["id"]
    job = drive(env, make_dispatcher(env, tmp_path), job_id, admin)
    assert job["status"] == "FAILED"
    assert "not configured" in env.client.get(f"/v1/jobs/{job_id}/events", headers=admin).json()[-1]["message"]


@pytest.mark.slow
@pytest.mark.parametrize("point", ["after-submitting-commit", "after-backend-answer"])
def test_a_dispatcher_killed_mid_submission_never_submits_twice(env: Env, admin: dict[str, str], tmp_path: Path,
                                                                point: str) -> None:
    runs = tmp_path / "runs"
    job_id = env.client.post("/v1/jobs", json=one_process(f"open('{runs}', 'a').write('run\\n')"),
                             headers=admin).json()["id"]
    folder = tmp_path / "local"
    crash = subprocess.run(
        [sys.executable, "-m", "service.cli.main", "worker", "--once"], cwd=ROOT, timeout=120,
        env={**os.environ, FAILPOINT_ENV: point, "SHARDCTL_DATABASE_URL": env.url, "SHARDCTL_DATA_DIR": str(tmp_path),
             "SHARDCTL_DISPATCHER_LEASE_S": "1"}, capture_output=True, text=True)
    assert crash.returncode == -9, crash.stderr  # SIGKILL at the failpoint
    with env.app.state.sessions.begin() as session:
        assert session.get(Job, job_id).status == "SUBMITTING"
    time.sleep(1.2)  # the dead dispatcher's lease runs out
    job = drive(env, make_dispatcher(env, folder, lease_s=1), job_id, admin)
    assert job["status"] == "SUCCEEDED"
    assert runs.read_text() == "run\n"  # exactly one run on the backend
    assert [a["backend_name"] for a in job["attempts"]] == [f"shardctl-{job_id}-1"]
    events = kinds(env, job_id, admin)
    assert "job.resume_submit" in events
    history = env.client.get(f"/v1/jobs/{job_id}/events", headers=admin).json()
    adopted = [e for e in history if e["kind"] == "job.pending"]
    assert adopted[0]["data"]["adopted"] is (point == "after-backend-answer")


DRAINED = 100  # real local jobs (a supervisor and a torchrun agent each: about 0.5 s of CPU a job)


@pytest.mark.slow
def test_two_dispatchers_drain_100_jobs_submitting_each_exactly_once(pg_env: Env, tmp_path: Path) -> None:
    """Two worker processes race for the same queue of `DRAINED` jobs: each job is claimed, submitted and
    run exactly once, and no lease is left behind."""
    env = pg_env
    admin = env.headers(env.token("admin"))
    runs = tmp_path / "runs"
    runs.mkdir()
    code = f"import os; open('{runs}/' + os.environ['SHARDCTL_JOB_ID'], 'a').write('x')"
    ids = [env.client.post("/v1/jobs", json=one_process(code, name=f"drain-{i}"), headers=admin).json()["id"]
           for i in range(DRAINED)]
    # Each worker logs every decision; a file (not a pipe nobody reads) can never block them.
    logs = (tmp_path / "workers.log").open("w")
    workers = [subprocess.Popen([sys.executable, "-m", "service.cli.main", "worker"], cwd=ROOT,
                                env={**os.environ, "SHARDCTL_DATABASE_URL": env.url,
                                     "SHARDCTL_DATA_DIR": str(tmp_path), "SHARDCTL_DISPATCHER_INTERVAL_S": "0.2"},
                                stdout=subprocess.DEVNULL, stderr=logs, text=True) for _ in range(2)]
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            with env.app.state.sessions.begin() as session:
                statuses = list(session.scalars(select(Job.status)))
            if all(s in TERMINAL for s in statuses):
                break
            time.sleep(1)
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            w.wait(timeout=30)
        logs.close()
    assert statuses.count("SUCCEEDED") == DRAINED, {s: statuses.count(s) for s in set(statuses)}
    assert sorted(int(p.name) for p in runs.iterdir()) == sorted(ids)
    assert {p.read_text() for p in runs.iterdir()} == {"x"}  # each job ran exactly once
    with env.app.state.sessions.begin() as session:
        attempts = list(session.scalars(select(Attempt.backend_name)))
        owners = {e for e in session.scalars(select(Job.lease_owner))}
    assert len(attempts) == len(set(attempts)) == DRAINED
    assert owners == {None}


def test_a_backend_requeue_is_recorded_as_a_new_attempt_with_its_reason(env: Env, admin: dict[str, str],
                                                                       tmp_path: Path) -> None:
    from workers.backends.base import Observation, RunState

    job_id = env.client.post("/v1/jobs", json=one_process("import time; time.sleep(60)"), headers=admin).json()["id"]
    dispatcher = make_dispatcher(env, tmp_path)
    drive(env, dispatcher, job_id, admin, until={"RUNNING"})
    # What the Slurm backend reports after a preemption: the same job id, requeued once.
    requeued = Observation(state=RunState.PENDING, requeues=1, requeue_reasons=["preempted by partition urgent"])
    dispatcher.apply(job_id, 1, requeued)
    dispatcher.apply(job_id, 2, requeued)  # seen again next cycle: recorded once
    job = env.client.get(f"/v1/jobs/{job_id}", headers=admin).json()
    first, second = job["attempts"]
    assert first["status"] == "PREEMPTED" and first["exit_reason"] == "requeued: preempted by partition urgent"
    assert second["number"] == 2 and second["backend_name"] == first["backend_name"]
    assert kinds(env, job_id, admin).count("job.requeued") == 1
    env.client.post(f"/v1/jobs/{job_id}/cancel", headers=admin)
    assert drive(env, dispatcher, job_id, admin)["status"] == "CANCELLED"
