"""Fixtures for the tests against the real local Slurm cluster (deploy/slurm.sh).

SHARDCTL_TEST_SLURM names the partition (scripts/test.sh sets it from deploy/slurm.sh's stdout). Unset:
the cluster tests skip with the reason, except under CI, where they fail.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from service.backend_options import SlurmOptions
from service.jobenv import JobEnv
from tests.specs import tiny_plan
from workers.backends.base import Handle, LaunchRequest, Observation, RunState, attempt_name
from workers.backends.slurm import SlurmBackend

SLURM_ENV = "SHARDCTL_TEST_SLURM"
URGENT = "urgent"  # deploy/slurm.sh's high-PriorityTier partition: preempts (requeues) jobs of the default one
TERMINAL = {RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED}
_ids = iter(range(int(time.time() * 10) % 10_000_000 * 100, 2**62))


def slurm_partition() -> str:
    partition = os.environ.get(SLURM_ENV)
    if partition:
        return partition
    if os.environ.get("CI"):
        pytest.fail(f"{SLURM_ENV} is not set: CI must run the Slurm tests (scripts/test.sh starts deploy/slurm.sh)")
    pytest.skip(f"Slurm tests skipped: set {SLURM_ENV} to a partition (export {SLURM_ENV}=$(deploy/slurm.sh))")


@pytest.fixture(scope="session")
def partition() -> str:
    return slurm_partition()


@pytest.fixture(scope="session")
def slurm_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("slurm")


@pytest.fixture(scope="session")
def backend(partition: str, slurm_folder: Path) -> SlurmBackend:
    return SlurmBackend(folder=slurm_folder, partition=partition)


def unique_job_id() -> int:
    """Job ids that no other test run used, so attempt names are unique in sacct's history."""
    return next(_ids)


def launch_request(command: list[str], *, nodes: int = 2, procs_per_node: int = 1, token: str = "test-job-token",
                   **options: Any) -> LaunchRequest:
    """Attempt 1 of a fresh job id on the Slurm backend; `options` are `SlurmOptions` fields."""
    job_id = unique_job_id()
    return LaunchRequest(job=JobEnv(job_id=job_id, attempt=1, plan=tiny_plan(), token=SecretStr(token)),
                         name=attempt_name(job_id, 1), team="default", nodes=nodes, procs_per_node=procs_per_node,
                         gpus_per_proc=0, command=command, user_env={"SHARDCTL_TEST": "1"},
                         options=SlurmOptions(kind="slurm", **options))


def py(code: str) -> list[str]:
    return ["python", "-c", code]


def wait_for(backend: SlurmBackend, handle: Handle, done: Callable[[Observation], bool],
             timeout: float = 90) -> Observation:
    deadline = time.monotonic() + timeout
    while True:
        obs = backend.poll([handle])[handle.name]
        if done(obs):
            return obs
        if time.monotonic() > deadline:
            raise AssertionError(f"{handle} still {obs}")
        time.sleep(0.3)


def sacct_states(job_id: str) -> list[str]:
    """Every accounting record of the job (requeued runs included), straight from sacct."""
    out = subprocess.run(["sacct", "-n", "-P", "-X", "-D", "-j", job_id, "-o", "State"], capture_output=True,
                         text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line]


def sacct_count_by_name(name: str, workdir: Path | None = None) -> int:
    """Jobs named `name` in sacct (the last day), only those run in `workdir` when given: each test
    database starts at job 1, so `shardctl-1-1` recurs across tests; the folder tells them apart."""
    out = subprocess.run(["sacct", "-n", "-P", "-X", "-S", "now-1days", "-E", "now", "--name", name,
                          "-o", "JobIDRaw,WorkDir"], capture_output=True, text=True, check=True).stdout
    rows = [line.split("|") for line in out.splitlines() if line]
    return len([r for r in rows if workdir is None or r[1] == str(workdir)])


__all__ = ["TERMINAL", "URGENT", "launch_request", "py", "sacct_count_by_name", "sacct_states", "tiny_plan",
           "wait_for"]
