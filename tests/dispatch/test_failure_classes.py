"""Failure classes from real runs on the local backend, through the dispatcher and the API: what a user
reads in `GET /v1/jobs/{id}` (and `shardctl show`) after a job failed, and whether it was retried."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from service.cli.render import attempt_lines
from tests.db_fixtures import Env
from tests.specs import tiny
from tests.support.dispatch import drive, make_dispatcher


def two_ranks(code: str, **extra: Any) -> dict[str, Any]:
    """A local job of two ranks under torchrun (the tiny spec's world), each running `python -c code`."""
    return tiny(entrypoint={"command": ["python", "-c", code], **extra})


def failed_job(env: Env, admin: dict[str, str], tmp_path: Path, spec: dict[str, Any]) -> dict[str, Any]:
    response = env.client.post("/v1/jobs", json=spec, headers=admin)
    assert response.status_code == 201, response.text
    job = drive(env, make_dispatcher(env, tmp_path), response.json()["id"], admin)
    assert job["status"] == "FAILED", job
    return job


def last_event(env: Env, admin: dict[str, str], job_id: int) -> dict[str, Any]:
    return env.client.get(f"/v1/jobs/{job_id}/events", headers=admin).json()[-1]  # type: ignore[no-any-return]


OWN_ERROR = ("import os, sys, time\n"
             "print('rank', os.environ['RANK'], 'starting', flush=True)\n"
             "if os.environ['RANK'] == '1':\n"
             "    print('my own error: learning_rate must be positive', file=sys.stderr, flush=True)\n"
             "    sys.exit(3)\n"
             "time.sleep(30)\n")


def test_a_program_error_keeps_the_programs_exit_code_and_its_own_lines(env: Env, admin: dict[str, str],
                                                                         tmp_path: Path) -> None:
    job = failed_job(env, admin, tmp_path, two_ranks(OWN_ERROR))
    assert len(job["attempts"]) == 1  # a program error is not retried
    attempt = job["attempts"][0]
    assert attempt["failure"] == "program_error"
    assert attempt["exit_code"] == 3  # the program's, not torchrun's 1
    assert attempt["exit_reason"] == "exit code 3"
    tail = attempt["log_tail"]
    assert "my own error: learning_rate must be positive" in tail
    assert "ChildFailedError" not in tail and "Root Cause" not in tail and "Traceback" not in tail
    event = last_event(env, admin, job["id"])
    assert event["kind"] == "job.failed"
    assert (event["data"]["failure"], event["data"]["exit_code"]) == ("program_error", 3)
    shown = "\n".join(attempt_lines(attempt))
    assert "program_error, exit code 3: exit code 3" in shown and "my own error" in shown


def test_an_environment_too_large_to_exec_is_a_launch_error_not_retried(env: Env, admin: dict[str, str],
                                                                        tmp_path: Path) -> None:
    spec = two_ranks("print('never runs')", env={"HUGE": "x" * 200_000})
    job = failed_job(env, admin, tmp_path, spec)
    assert len(job["attempts"]) == 1
    attempt = job["attempts"][0]
    assert attempt["failure"] == "launch_error"
    assert "Argument list too long" in attempt["exit_reason"]
    assert attempt["exit_code"] is None  # nothing ran, so there is no program exit code
    event = last_event(env, admin, job["id"])
    assert event["data"]["failure"] == "launch_error" and "Argument list too long" in event["message"]


HOST_OOM = ("import os, resource, time\n"
            "if os.environ['RANK'] == '0':\n"
            "    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
            "    hog = bytearray(2 << 30)\n"
            "time.sleep(30)\n")


def test_running_out_of_host_memory_is_oom_host(env: Env, admin: dict[str, str], tmp_path: Path) -> None:
    job = failed_job(env, admin, tmp_path, two_ranks(HOST_OOM))
    assert len(job["attempts"]) == 1  # the same spec runs out of memory again: not retried
    attempt = job["attempts"][0]
    assert attempt["failure"] == "oom_host", attempt
    assert attempt["exit_code"] == 1 and "MemoryError" in attempt["log_tail"]
    assert "host memory" in attempt["exit_reason"]


def test_a_single_process_job_killed_by_a_signal_says_which(env: Env, admin: dict[str, str],
                                                            tmp_path: Path) -> None:
    code = "import os, signal; print('about to stop', flush=True); os.kill(os.getpid(), signal.SIGSEGV)"
    job = failed_job(env, admin, tmp_path, tiny(resources={"gpus_per_node": 1},
                                                entrypoint={"command": ["python", "-c", code]}))
    attempt = job["attempts"][0]
    assert (attempt["failure"], attempt["exit_code"]) == ("program_error", -11)
    assert "SIGSEGV" in attempt["exit_reason"] and "about to stop" in attempt["log_tail"]
    assert len(job["attempts"]) == 1


def test_a_program_exiting_75_without_notice_is_its_own_error_not_a_preemption(env: Env, admin: dict[str, str],
                                                                               tmp_path: Path) -> None:
    # 75 is what the runtime exits with after a preemption notice; a program may use it (EX_TEMPFAIL)
    code = "import sys; print('temporary failure', flush=True); sys.exit(75)"
    job = failed_job(env, admin, tmp_path, tiny(resources={"gpus_per_node": 1},
                                                entrypoint={"command": ["python", "-c", code]}))
    assert [(a["failure"], a["exit_code"]) for a in job["attempts"]] == [("program_error", 75)]


@pytest.mark.parametrize("message,expected", [
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "oom_gpu"),
    ("MemoryError", "oom_host"),
])
def test_an_out_of_memory_message_from_the_program_names_the_memory(env: Env, admin: dict[str, str],
                                                                   tmp_path: Path, message: str,
                                                                   expected: str) -> None:
    """The message as the program's traceback ends with it (torch raises the first on a CUDA device;
    no GPU is needed to print it), so the class comes from the program's own last lines."""
    code = f"import sys\nprint('step 1', flush=True)\nprint({message!r}, file=sys.stderr)\nsys.exit(1)\n"
    job = failed_job(env, admin, tmp_path, tiny(resources={"gpus_per_node": 1},
                                                entrypoint={"command": ["python", "-c", code]}))
    attempt = job["attempts"][0]
    assert attempt["failure"] == expected and attempt["exit_code"] == 1
    assert len(job["attempts"]) == 1


def test_a_local_time_limit_stops_the_job_as_a_timeout_not_retried(env: Env, admin: dict[str, str],
                                                                   tmp_path: Path) -> None:
    code = "import time; print('training until stopped', flush=True); time.sleep(600)"
    spec = tiny(resources={"gpus_per_node": 1}, backend={"kind": "local", "time_limit": "00:00:10"},
                entrypoint={"command": ["python", "-c", code]})
    job = failed_job(env, admin, tmp_path, spec)
    assert len(job["attempts"]) == 1  # the same limit would stop it again
    attempt = job["attempts"][0]
    assert attempt["failure"] == "timeout" and "time limit reached (10 s" in attempt["exit_reason"]
    assert "training until stopped" in attempt["log_tail"]
    assert last_event(env, admin, job["id"])["data"]["failure"] == "timeout"


@pytest.mark.parametrize("limit", ["3 seconds", "00:00:00", "400-00:00:00"])
def test_a_bad_local_time_limit_is_refused_at_submit_naming_the_field(env: Env, admin: dict[str, str],
                                                                     limit: str) -> None:
    response = env.client.post("/v1/jobs", json=tiny(backend={"kind": "local", "time_limit": limit}), headers=admin)
    assert response.status_code == 422
    body = response.json()["error"]
    assert [f["loc"] for f in body["fields"]] == ["backend.time_limit"], body
    message = body["fields"][0]["message"]
    assert "time limit" in message and ("HH:MM[:SS]" in message or "e.g. 00:00:30" in message), message
