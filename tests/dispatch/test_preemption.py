"""Preemption end to end on the local backend: a real two-rank gloo job running the built-in runtime is
preempted through `Dispatcher.preempt`, checkpoints, goes back to the queue, resumes from its checkpoint
and finishes the spec's steps; the preemption is an event naming who and why, and is not counted
against max_attempts."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from service.joblogs import split_rank
from service.store.vocab import MeasurementKind
from tests.db_fixtures import Env
from tests.runtime.harness import spec_dict
from tests.specs import launch_request, tiny
from tests.support.runtime_jobs import RUNTIME, beats, job, measurements
from workers.backends.base import RunState
from workers.backends.local import LocalBackend
from workers.backends.local_supervisor import job_checkpoint_dir
from workers.dispatch.context import DispatcherConfig
from workers.dispatch.preempt import being_preempted, mark_preempted
from workers.dispatcher import Dispatcher
from workers.runtime import checkpoint

STEPS = 60


@pytest.mark.slow
def test_a_preempted_job_checkpoints_requeues_and_resumes_its_steps(env: Env, admin: dict[str, str], live: str,
                                                                    tmp_path: Path) -> None:
    spec = {**spec_dict(2, steps=STEPS), "entrypoint": {"command": RUNTIME}}
    job_id = env.client.post("/v1/jobs", json=spec, headers=admin).json()["id"]
    backend = LocalBackend(tmp_path / "local")
    # max_attempts=1: any counted retry would fail the job, so its second attempt shows the preemption is free
    dispatcher = Dispatcher(env.app.state.sessions, {"local": backend},
                            DispatcherConfig(api_url=live, retry_backoff_s=0.1, max_attempts=1, preempt_grace_s=60))
    deadline = time.monotonic() + 180
    while not beats(env, job_id) or beats(env, job_id)[-1] < 2:
        assert time.monotonic() < deadline, f"no heartbeat; job is {job(env, job_id, admin)['status']}"
        dispatcher.run_once()
        time.sleep(0.1)
    assert job(env, job_id, admin)["status"] == "RUNNING"

    dispatcher.preempt(job_id, by=4242, reason="team a reclaims its nominal quota")
    dispatcher.preempt(job_id, by=4343, reason="chosen again")  # already being preempted: not chosen twice
    with env.app.state.sessions() as session:
        assert being_preempted(session) == {job_id}  # what admission reads so as not to choose it again

    deadline = time.monotonic() + 300
    while job(env, job_id, admin)["status"] not in {"SUCCEEDED", "FAILED", "CANCELLED"}:
        assert time.monotonic() < deadline, f"job stuck in {job(env, job_id, admin)['status']}"
        dispatcher.run_once()
        time.sleep(0.1)
    final = job(env, job_id, admin)
    assert final["status"] == "SUCCEEDED", final
    with env.app.state.sessions() as session:
        assert being_preempted(session) == set()
    events = env.client.get(f"/v1/jobs/{job_id}/events", headers=admin).json()
    preempted = [e for e in events if e["kind"] == "job.preempted"]
    assert len(preempted) == 1
    assert preempted[0]["data"]["by"] == 4242 and preempted[0]["data"]["reason"] == "team a reclaims its nominal quota"
    assert "preempted by job 4242" in preempted[0]["message"]
    kinds = [e["kind"] for e in events]
    assert kinds.index("job.preempted") < kinds.index("job.queued", 1)  # back in the queue after the notice

    first, second = final["attempts"]
    assert first["failure"] == "preempted" and "preempted by job 4242" in (first["exit_reason"] or "")
    assert second["status"] == "SUCCEEDED"

    # the steps continue: 1..k in the first attempt, k+1..STEPS in the second, none twice, none missing
    steps = beats(env, job_id)
    assert steps == list(range(1, STEPS + 1))
    report = final["measurements"]["report"]["data"]
    assert report["status"] == "succeeded" and 2 <= report["start_step"] < STEPS
    assert report["start_step"] + report["steps"] == STEPS
    # the checkpoint the second attempt resumed from is the job's, not the attempt's
    assert checkpoint.latest_step(job_checkpoint_dir(backend.folder, job_id)) == report["start_step"]
    first_run = tmp_path / "local" / first["backend_name"]
    assert '"preempted": true' in (first_run / "exit.json").read_text()
    reports = [r["status"] for r in measurements(env, job_id, MeasurementKind.REPORT)]
    assert reports == ["preempted", "succeeded"]  # the first attempt stopped by itself, after its checkpoint
    # the runtime's own log lines carry their rank once: torchrun's label (which the log readers split
    # off into `rank`), not a second one of the runtime's own
    logged = [split_rank(x) for x in (tmp_path / "local" / second["backend_name"] / "node0.log").read_text()
              .splitlines()]
    ours = [(rank, text) for rank, text in logged if rank is not None and text.startswith("INFO ")]
    assert ours and {rank for rank, _ in ours} <= {0, 1}
    assert not [text for rank, text in logged if rank is not None and text.startswith("[rank")]


IGNORE_TERM = ("import os, signal, sys, time, pathlib; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
               " pathlib.Path(sys.argv[1], os.environ['RANK']).write_text(str(os.getpid())); time.sleep(300)")


@pytest.mark.parametrize("procs", [1, 2])
def test_a_program_that_ignores_the_notice_is_killed_after_the_grace_period(tmp_path: Path, procs: int) -> None:
    """The supervisor kills every process below it once the grace period is over (one process alone would
    sleep 300 s; under torchrun the ranks run in sessions of their own), and the attempt still ends as
    preempted, not as the program's error."""
    marks = tmp_path / "marks"
    marks.mkdir()
    backend = LocalBackend(tmp_path / "local")
    handle = backend.submit(launch_request("shardctl-7-1", ["python", "-c", IGNORE_TERM, str(marks)],
                                            procs=procs))
    deadline = time.monotonic() + 120
    while len(list(marks.iterdir())) < procs:
        assert time.monotonic() < deadline, "the ranks never started"
        time.sleep(0.1)
    pids = [int(p.read_text()) for p in marks.iterdir()]
    backend.preempt(handle, grace_s=1.0)
    for _ in range(10):  # later notices neither extend the first one's grace period nor hang the supervisor
        backend.preempt(handle, grace_s=600.0)
    deadline = time.monotonic() + 90
    while (obs := backend.poll([handle])[handle.name]).state not in {RunState.FAILED, RunState.SUCCEEDED,
                                                                     RunState.CANCELLED}:
        assert time.monotonic() < deadline, f"still {obs.state} after the grace period"
        time.sleep(0.1)
    assert obs.state == RunState.FAILED and obs.failure == "preempted"
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1]


def test_a_dispatcher_killed_between_the_mark_and_the_notice_gives_notice_after_restart(
        env: Env, admin: dict[str, str], tmp_path: Path) -> None:
    # attempt 1 waits for a notice; attempt 2 finishes at once
    code = ("import os, sys, time\n"
            "if os.environ['SHARDCTL_ATTEMPT'] != '1':\n"
            "    sys.exit(0)\n"
            "time.sleep(300)\n")
    spec = tiny(resources={"gpus_per_node": 1}, entrypoint={"command": ["python", "-c", code]})
    job_id = env.client.post("/v1/jobs", json=spec, headers=admin).json()["id"]
    backend = LocalBackend(tmp_path / "local")
    config = DispatcherConfig(retry_backoff_s=0.1, preempt_grace_s=5)
    first = Dispatcher(env.app.state.sessions, {"local": backend}, config)
    deadline = time.monotonic() + 120
    while job(env, job_id, admin)["status"] != "RUNNING":
        assert time.monotonic() < deadline, job(env, job_id, admin)["status"]
        first.run_once()
        time.sleep(0.1)
    # the state a SIGKILL at the `after-preempt-mark` failpoint leaves: marked and committed, no notice sent
    assert mark_preempted(first, job_id, by=99, reason="reclaim") is not None
    time.sleep(1)
    assert job(env, job_id, admin)["status"] == "RUNNING"  # without a notice the victim runs on

    restarted = Dispatcher(env.app.state.sessions, {"local": backend}, config)
    deadline = time.monotonic() + 120
    while job(env, job_id, admin)["status"] not in {"SUCCEEDED", "FAILED", "CANCELLED"}:
        assert time.monotonic() < deadline, job(env, job_id, admin)["status"]
        restarted.run_once()
        time.sleep(0.1)
    final = job(env, job_id, admin)
    assert final["status"] == "SUCCEEDED", final
    assert [a["failure"] for a in final["attempts"]] == ["preempted", None]
