"""`backend_pending` on the real Slurm cluster: with both nodes held by another job, a job the dispatcher
hands to Slurm waits there; `GET /v1/jobs/{id}/explain` quotes Slurm's own reason (`Resources`, or
`Priority` when others wait ahead of it) and its start estimate, the same one `squeue --start` shows;
the dispatcher records each change once (`job.backend_pending`), with one sacct and one squeue per
cycle. Once the nodes are free the job runs and explain no longer says so."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from service.cli.scheduling_cmds import explanation_lines
from service.store.backend_pending import change_key
from tests.db_fixtures import Env
from tests.slurm.conftest import slurm_partition
from tests.support.slurm_dispatch import drive, events, slurm_job
from workers.backends.slurm import SlurmBackend
from workers.backends.slurm.accounting import start_time
from workers.dispatch.context import DispatcherConfig
from workers.dispatcher import Dispatcher

sqlite_only = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
SLURM_REASONS = {"Resources", "Priority"}


def squeue(job_id: str, fmt: str, *extra: str) -> str:
    return subprocess.run(["squeue", "-h", "-j", job_id, "-o", fmt, *extra], capture_output=True, text=True,
                          check=False).stdout.strip()


@pytest.fixture
def nodes_held(tmp_path: Path) -> Iterator[str]:
    """A job holding every node of the partition (exclusive, 3-minute limit, so Slurm can estimate when
    they free up), running before the test starts; cancelled afterwards whatever happens. Waits while
    another run (CI) holds the nodes."""
    partition = slurm_partition()
    job_id = subprocess.run(["sbatch", "--parsable", "-p", partition, "-N2", "--exclusive", "-t", "3",
                             "-J", "shardctl-test-filler", f"--chdir={tmp_path}", "--wrap", "sleep 170"],
                            capture_output=True, text=True, check=True).stdout.strip().split(";")[0]
    try:
        deadline = time.monotonic() + 240
        while squeue(job_id, "%T") != "RUNNING":
            assert time.monotonic() < deadline, f"the filler job never ran: {squeue(job_id, '%T|%r')}"
            time.sleep(0.5)
        yield job_id
    finally:
        subprocess.run(["scancel", job_id], capture_output=True, check=False)


def explain(env: Env, job_id: int, admin: dict[str, str]) -> dict[str, Any]:
    result: dict[str, Any] = env.client.get(f"/v1/jobs/{job_id}/explain", headers=admin).json()
    return result


@sqlite_only
def test_a_job_slurm_holds_is_explained_with_slurms_reason_and_estimate(
        env: Env, admin: dict[str, str], partition: str, tmp_path: Path, nodes_held: str) -> None:
    command = ["python", "-c", "print('ran', flush=True)"]
    job_id = env.client.post("/v1/jobs", json=slurm_job(partition, command), headers=admin).json()["id"]
    backend = SlurmBackend(folder=tmp_path / "slurm", partition=partition)
    dispatcher = Dispatcher(env.app.state.sessions, {"slurm": backend}, DispatcherConfig(retry_backoff_s=0.1))
    drive(env, dispatcher, job_id, admin, until={"PENDING"})
    slurm_id = env.client.get(f"/v1/jobs/{job_id}", headers=admin).json()["attempts"][0]["backend_id"]

    # Cycles until Slurm has both a reason and a start estimate (its scheduler plans within seconds);
    # each cycle polls with ONE sacct and ONE squeue, however long the job waits.
    deadline = time.monotonic() + 90
    cycles = 0
    while True:
        before = dict(backend.calls)
        dispatcher.run_once()
        cycles += 1
        assert {k: backend.calls[k] - before.get(k, 0) for k in backend.calls if backend.calls[k] != before.get(k, 0)
                } == {"sacct": 1, "squeue": 1}
        why = explain(env, job_id, admin)
        assert why["status"] == "PENDING", why
        if why["reasons"] and why["eta"] and why["eta"]["backend_start_s"] is not None:
            break
        if time.monotonic() > deadline:
            break  # Slurm gave no estimate: what explain says about that is checked below
        time.sleep(0.5)

    # explain quotes Slurm: its reason, and its own estimate next to shardctl's band (none: no Slurm pool)
    [reason] = why["reasons"]
    assert reason["code"] == "backend_pending" and why["admitted"] is True
    slurm_reason = squeue(slurm_id, "%r")
    assert slurm_reason in SLURM_REASONS and reason["message"].endswith(f"Slurm holds it: {slurm_reason}"), why
    estimate = start_time(squeue(slurm_id, "%S", "--start"))  # what `squeue --start` says now
    eta = why["eta"]
    assert "squeue --start" in eta["method"] and eta["earliest_s"] is None and eta["latest_s"] is None
    if estimate is None:
        assert eta["backend_start_s"] is None and "gives no start estimate" in eta["method"]
    else:
        assert eta["backend_start_s"] is not None and eta["backend_start_s"] >= 0
        recorded = [e for e in events(env, job_id, admin) if e["kind"] == "job.backend_pending"][-1]
        assert abs(recorded["data"]["expected_start"] - estimate) < 60  # the same estimate, give or take a re-plan
    lines = explanation_lines(job_id, why)
    assert any(f"Slurm holds it: {slurm_reason}" in line for line in lines)
    assert any(line.startswith("  the backend's estimate: ") for line in lines), lines

    # Recorded on change only: at most one event a cycle, never the same news twice in a row. The cycle
    # in `drive` that saw the job PENDING counts too: it may record the first news (Slurm's first
    # reason, before its scheduler has an estimate).
    pending = [e for e in events(env, job_id, admin) if e["kind"] == "job.backend_pending"]
    assert 1 <= len(pending) <= cycles + 1
    keys = [change_key(e["data"]["reason"], e["data"]["expected_start"]) for e in pending]
    assert all(a != b for a, b in pairwise(keys)) and all(e["data"]["attempt"] == 1 for e in pending)
    dispatcher.run_once()
    dispatcher.run_once()
    now = [e for e in events(env, job_id, admin) if e["kind"] == "job.backend_pending"]
    assert len(now) - len(pending) <= 1  # only if Slurm changed its mind meanwhile

    # The nodes free up: the job runs, and explain no longer speaks of Slurm holding it.
    subprocess.run(["scancel", nodes_held], check=True)
    job = drive(env, dispatcher, job_id, admin, timeout=120)
    assert job["status"] == "SUCCEEDED", events(env, job_id, admin)[-1]
    assert not explain(env, job_id, admin)["reasons"]
