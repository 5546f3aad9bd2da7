"""Failure classes from real runs on the local Slurm cluster, through the API and the dispatcher: the
program's own exit code and lines (not torchrun's), and a host out-of-memory. The time limit is
`test_time_limit.py`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.db_fixtures import Env
from tests.slurm.conftest import sacct_states
from tests.support.slurm_dispatch import drive, make_dispatcher, slurm_job

sqlite_only = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def two_ranks(partition: str, code: str) -> dict[str, Any]:
    """A 1-node job of 2 ranks under torchrun. (With 2 nodes, a node whose ranks all succeed waits in
    torchrun's exit barrier, 300 s, for the node that failed: real ranks fail in their next collective.)"""
    spec = slurm_job(partition, ["python", "-c", code])
    spec["resources"].update(nodes=1, gpus_per_node=2)
    return spec


OWN_ERROR = ("import os, sys, time\n"
             "if os.environ['RANK'] == '1':\n"
             "    print('my own error: the data path does not exist', file=sys.stderr, flush=True)\n"
             "    sys.exit(3)\n"
             "time.sleep(60)\n")


@sqlite_only
def test_a_program_error_on_slurm_keeps_the_programs_exit_code_and_lines(env: Env, admin: dict[str, str],
                                                                         partition: str, tmp_path: Path) -> None:
    response = env.client.post("/v1/jobs", json=two_ranks(partition, OWN_ERROR), headers=admin)
    assert response.status_code == 201, response.text
    job = drive(env, make_dispatcher(env, tmp_path / "slurm", partition), response.json()["id"], admin)
    assert job["status"] == "FAILED" and len(job["attempts"]) == 1  # not retried
    attempt = job["attempts"][0]
    assert (attempt["failure"], attempt["exit_code"]) == ("program_error", 3)  # the program's, not torchrun's 1
    assert "my own error: the data path does not exist" in attempt["log_tail"]
    assert "ChildFailedError" not in attempt["log_tail"]
    assert sacct_states(attempt["backend_id"]) == ["FAILED"]


HOST_OOM = ("import resource\n"
            "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
            "hog = bytearray(2 << 30)\n")


@sqlite_only
def test_running_out_of_host_memory_on_slurm_is_oom_host(env: Env, admin: dict[str, str], partition: str,
                                                         tmp_path: Path) -> None:
    response = env.client.post("/v1/jobs", json=slurm_job(partition, ["python", "-c", HOST_OOM]), headers=admin)
    assert response.status_code == 201, response.text
    job = drive(env, make_dispatcher(env, tmp_path / "slurm", partition), response.json()["id"], admin)
    assert job["status"] == "FAILED" and len(job["attempts"]) == 1  # the same spec would run out again
    attempt = job["attempts"][0]
    assert attempt["failure"] == "oom_host", attempt
    assert "MemoryError" in attempt["log_tail"] and attempt["exit_code"] == 1
