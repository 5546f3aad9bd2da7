"""Reclaim on a declared Slurm pool: shardctl's own preemption gives the admission back.

A borrower's job runs in a Slurm pool; the pool's owner submits; admission chooses the borrower as the
victim and the dispatcher preempts it (`scancel`: SIGTERM, the runtime checkpoints into the job's
checkpoint folder). The victim goes back to QUEUED without its pool, is not chosen again while it waits
(its Slurm job is over and never starts by itself), the owner's job runs to the end, then the victim is
admitted again: one fresh sbatch per attempt, resuming from its checkpoint with the steps continuing.

The first tests need no cluster: the dispatcher's bookkeeping of a preempted attempt's end, with the
observations a Slurm poll gives."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from service.lifecycle_decide import counts_against_max_attempts
from service.scheduling.snapshot import SnapshotParams
from service.store.models import Attempt, Job, utcnow
from service.store.states import transition
from service.store.vocab import AttemptStatus, FailureClass, JobStatus, MeasurementKind
from tests.db_fixtures import Env
from tests.runtime.harness import spec_dict
from tests.slurm.conftest import sacct_count_by_name, sacct_states
from tests.specs import tiny
from tests.support.runtime_jobs import beats, measurements
from workers.backends.base import RunState
from workers.backends.slurm import SlurmBackend, SlurmObservation
from workers.backends.slurm.accounting import lags, merge
from workers.backends.slurm.states import observe
from workers.dispatch.context import DispatcherConfig
from workers.dispatch.preempt import being_preempted, mark_preempted
from workers.dispatcher import Dispatcher

sqlite_only = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
STEPS = 40
RUNTIME = ["python", "-m", "workers.runtime", "--heartbeat-every", "1", "--no-profile", "--no-track-memory",
           "--timeout-s", "120"]
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def get(env: Env, headers: dict[str, str], path: str) -> Any:
    r = env.client.get(path, headers=headers)
    assert r.status_code == 200, r.text
    return r.json()


# -- no cluster needed: the bookkeeping ---------------------------------------------------------------

def running_in_pool(env: Env, admin: dict[str, str], tmp_path: Path) -> tuple[Dispatcher, int]:
    """A Slurm job RUNNING as attempt 1 (Slurm id 4242) and admitted to pool `p`, as the dispatcher leaves
    one; its backend never gets a call (no poll: the tests hand `apply` what a poll would observe)."""
    job_id = env.client.post("/v1/jobs", json=tiny(backend={"kind": "slurm"}), headers=admin).json()["id"]
    dispatcher = Dispatcher(env.app.state.sessions, {"slurm": SlurmBackend(folder=tmp_path / "slurm")})
    with env.app.state.sessions.begin() as session:
        job = session.get(Job, job_id)
        assert job is not None
        job.pool = "p"
        for status in (JobStatus.SUBMITTING, JobStatus.PENDING, JobStatus.RUNNING):
            transition(session, job, status, actor="test")
        session.add(Attempt(job_id=job_id, number=1, backend_name=f"shardctl-{job_id}-1", backend_id="4242",
                            status=AttemptStatus.RUNNING, nodes=["node1"], started_at=utcnow()))
    return dispatcher, job_id


def stored(env: Env, job_id: int) -> tuple[JobStatus, str | None, list[tuple[int, Any, Any, bool]]]:
    """(status, pool, [(number, failure, exit_reason, finished)]) of the job as stored."""
    with env.app.state.sessions() as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job.status, job.pool, [(a.number, a.failure, a.exit_reason, a.finished_at is not None)
                                      for a in job.attempts]


def test_a_preempted_attempt_that_slurm_ends_gives_the_admission_back(env: Env, admin: dict[str, str],
                                                                        tmp_path: Path) -> None:
    dispatcher, job_id = running_in_pool(env, admin, tmp_path)
    assert mark_preempted(dispatcher, job_id, by=7, reason="team a reclaims its quota") is not None
    # what a poll reads while the processes run out KillWait (sacct CANCELLED, squeue COMPLETING) ...
    accounted = {"JobIDRaw": "4242", "JobName": f"shardctl-{job_id}-1", "State": "CANCELLED by 0",
                 "ExitCode": "0:15", "NodeList": "node1", "Reason": "None", "WorkDir": "/w", "NNodes": "1"}
    assert lags([accounted])  # so the poll asks squeue too
    completing = observe(merge([accounted], {**accounted, "State": "COMPLETING", "ExitCode": "0:0"}) or [])
    assert completing.state == RunState.RUNNING  # ... is not the end yet: the checkpoint is being written
    dispatcher.apply(job_id, 1, completing)
    assert stored(env, job_id)[:2] == (JobStatus.RUNNING, "p")
    # ... then the end
    dispatcher.apply(job_id, 1, SlurmObservation(state=RunState.CANCELLED, failure=FailureClass.CANCELLED,
                                                 reason="cancelled by 0", job_id="4242"))
    status, pool, attempts = stored(env, job_id)
    assert (status, pool) == (JobStatus.QUEUED, None)  # back in the queue, admission given back
    assert attempts == [(1, FailureClass.PREEMPTED, attempts[0][2], True)]
    assert attempts[0][2].startswith("preempted by job 7: team a reclaims its quota")
    with env.app.state.sessions() as session:
        job = session.get(Job, job_id)
        assert job is not None and job.admitted_at is None
        assert not any(counts_against_max_attempts(a.failure) for a in job.attempts)
        assert job_id not in being_preempted(session)


def test_a_preempted_attempt_that_slurm_requeues_anyway_keeps_its_mark(env: Env, admin: dict[str, str],
                                                                        tmp_path: Path) -> None:
    """A requeue racing shardctl's preemption (Slurm's own, or one sent by an older dispatcher): the
    requeued run inherits the mark, so it gets notice and its end gives the admission back."""
    dispatcher, job_id = running_in_pool(env, admin, tmp_path)
    assert mark_preempted(dispatcher, job_id, by=7, reason="reclaim") is not None
    dispatcher.apply(job_id, 1, SlurmObservation(state=RunState.PENDING, requeues=1, job_id="4242",
                                                 requeue_reasons=["requeued (run on node1)"]))
    status, pool, attempts = stored(env, job_id)
    assert (status, pool) == (JobStatus.RUNNING, "p")
    assert [(n, f, done) for n, f, _, done in attempts] == [(1, FailureClass.PREEMPTED, True),
                                                            (2, FailureClass.PREEMPTED, False)]
    assert attempts[1][2] == "preempted by job 7: reclaim"
    with env.app.state.sessions() as session:
        assert job_id in being_preempted(session)  # never chosen as a victim twice
    dispatcher.apply(job_id, 2, SlurmObservation(state=RunState.CANCELLED, failure=FailureClass.CANCELLED,
                                                 reason="cancelled by 0", requeues=1, job_id="4242"))
    status, pool, attempts = stored(env, job_id)
    assert (status, pool) == (JobStatus.QUEUED, None)
    with env.app.state.sessions() as session:
        job = session.get(Job, job_id)
        assert job is not None and not any(counts_against_max_attempts(a.failure) for a in job.attempts)


def test_slurms_own_requeue_keeps_the_admission_as_before(env: Env, admin: dict[str, str], tmp_path: Path) -> None:
    dispatcher, job_id = running_in_pool(env, admin, tmp_path)
    dispatcher.apply(job_id, 1, SlurmObservation(state=RunState.PENDING, requeues=1, job_id="4242",
                                                 requeue_reasons=["preempted (run on node1)"]))
    status, pool, attempts = stored(env, job_id)
    assert (status, pool) == (JobStatus.RUNNING, "p")
    assert [(n, f, done) for n, f, _, done in attempts] == [(1, FailureClass.PREEMPTED, True), (2, None, False)]


# -- on the real cluster ---------------------------------------------------------------------------------

@sqlite_only
def test_an_owner_reclaims_a_slurm_pool_from_a_borrower_which_resumes_after_it(
        env: Env, admin: dict[str, str], live: str, partition: str, tmp_path: Path) -> None:
    assert env.client.put("/v1/pools/slurm-cpu", json={"backend": "slurm", "gpu": "cpu", "gpus": 2},
                          headers=admin).status_code in (200, 201)
    for team, quota in {"owner": {"flavors": {"cpu": {"nominal": 2}}},
                        "borrower": {"flavors": {"cpu": {"nominal": 0, "borrowing_limit": 2}}}}.items():
        assert env.client.put(f"/v1/teams/{team}/quota", json=quota, headers=admin).status_code == 200
    owner = env.headers(env.token("member", team="owner"))
    borrower = env.headers(env.token("member", team="borrower"))
    slurm = {"kind": "slurm", "partition": partition}

    spec = {**spec_dict(2, steps=STEPS), "name": "borrowed", "team": "borrower", "entrypoint": {"command": RUNTIME},
            "backend": slurm}
    victim = env.client.post("/v1/jobs", json=spec, headers=borrower).json()["id"]
    backend = SlurmBackend(folder=tmp_path / "slurm", partition=partition)
    dispatcher = Dispatcher(env.app.state.sessions, {"slurm": backend},
                            DispatcherConfig(api_url=live, retry_backoff_s=0.1, max_attempts=1,
                                             scheduling=SnapshotParams(min_runtime_s=0)))
    deadline = time.monotonic() + 90
    while not beats(env, victim) or beats(env, victim)[-1] < 2:
        assert time.monotonic() < deadline, get(env, admin, f"/v1/jobs/{victim}")["status"]
        dispatcher.run_once()
        time.sleep(0.2)
    first_id = get(env, admin, f"/v1/jobs/{victim}")["attempts"][0]["backend_id"]

    # the owner's job needs the whole pool; it holds it until the test says so
    hold = tmp_path / "release-owner"
    code = f"import os, time\nwhile not os.path.exists({str(hold)!r}): time.sleep(0.1)"
    mine = env.client.post("/v1/jobs", headers=owner, json=tiny(
        name="mine", team="owner", resources={"gpus_per_node": 2}, backend=slurm,
        entrypoint={"command": ["python", "-c", code]})).json()["id"]
    deadline = time.monotonic() + 90
    while get(env, admin, f"/v1/jobs/{mine}")["status"] != "RUNNING":
        assert time.monotonic() < deadline, (get(env, admin, f"/v1/jobs/{mine}")["status"],
                                             get(env, admin, f"/v1/jobs/{victim}")["status"])
        dispatcher.run_once()
        time.sleep(0.2)
    for _ in range(5):  # the victim waits: never chosen again, its Slurm job over and not started by Slurm
        dispatcher.run_once()
        status, pool, attempts = stored(env, victim)
        assert (status, pool, len(attempts)) == (JobStatus.QUEUED, None, 1)
        time.sleep(0.2)
    assert sacct_states(first_id) == ["CANCELLED"]
    squeue = subprocess.run(["squeue", "-h", "-j", first_id, "-o", "%T"], capture_output=True, text=True).stdout
    assert squeue.strip() in ("", "CANCELLED")

    hold.write_text("")
    deadline = time.monotonic() + 120
    while get(env, admin, f"/v1/jobs/{victim}")["status"] not in TERMINAL:
        assert time.monotonic() < deadline, get(env, admin, f"/v1/jobs/{victim}")["status"]
        dispatcher.run_once()
        time.sleep(0.2)
    final = get(env, admin, f"/v1/jobs/{victim}")
    assert final["status"] == "SUCCEEDED", final
    assert get(env, admin, f"/v1/jobs/{mine}")["status"] == "SUCCEEDED"
    events = get(env, borrower, f"/v1/jobs/{victim}/events")
    preempted = [e for e in events if e["kind"] == "job.preempted"]
    assert len(preempted) == 1 and preempted[0]["data"]["by_team"] == "owner"  # once, by the owner team
    assert preempted[0]["data"]["by"] is None and f"job {mine}" not in preempted[0]["message"]  # never by id
    # admitted and submitted again only once the owner's job had ended (event ids are one sequence)
    ended = [e["id"] for e in get(env, owner, f"/v1/jobs/{mine}/events") if e["kind"] == "job.succeeded"]
    resubmitted = [e["id"] for e in events if e["kind"] == "job.submitting"][1:]
    assert len(ended) == 1 and len(resubmitted) == 1 and resubmitted[0] > ended[0]
    assert [a["failure"] for a in final["attempts"]] == ["preempted", None]
    first, second = final["attempts"]
    assert first["backend_id"] == first_id and second["backend_id"] != first_id
    for attempt in final["attempts"]:  # each sbatch is exactly one attempt
        name = f"shardctl-{victim}-{attempt['number']}"
        assert sacct_count_by_name(name, tmp_path / "slurm" / name) == 1
    assert beats(env, victim) == list(range(1, STEPS + 1))  # steps continue, none twice, none missing
    reports = measurements(env, victim, MeasurementKind.REPORT)
    assert [r["status"] for r in reports] == ["preempted", "succeeded"]
    assert 2 <= reports[-1]["start_step"] < STEPS and reports[-1]["start_step"] + reports[-1]["steps"] == STEPS
