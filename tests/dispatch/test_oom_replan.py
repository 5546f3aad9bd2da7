"""Out-of-memory recovery end to end on the local backend: a real two-rank gloo job running the built-in
runtime under a per-process memory budget that its first layout exceeds runs out of memory, is planned
again under what it measured (a smaller micro-batch, the same global batch) and succeeds on its second
attempt, though the dispatcher that decided the re-plan stops before submitting it; the `job.replanned`
event names both layouts and the measured peak, and both attempts are in the job's view. With
`recovery.replan_on_oom` off the same job fails as before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from service.failures import FailureClass, measured_oom
from tests.db_fixtures import Env
from tests.runtime.harness import spec_dict
from tests.support.dispatch import drive, make_dispatcher
from workers.backends.base import Observation, RunState

#: Live tensor bytes per rank of the tiny model (`tests.runtime.harness`), dp=2 DDP, 4 sequences per rank,
#: AdamW, as the runtime's CPU budget counts them: more than 5.4 MB with micro-batch 4, less than 5.0 MB with 2, so
#: the planner's first choice (micro-batch 4, the fastest) runs out and one re-plan fits.
BUDGET = "5200000"
RUNTIME = ["python", "-m", "workers.runtime", "--no-profile", "--no-track-memory", "--timeout-s", "30",
           "--memory-budget", BUDGET]


def oom_spec(*, replan: bool) -> dict[str, Any]:
    spec = spec_dict(2, global_batch=8, steps=2)
    return {**spec, "layout": {"dp": 2, "sharding": "ddp"}, "entrypoint": {"command": RUNTIME},
            "recovery": {"replan_on_oom": replan, "max_replans": 3}}


def events(env: Env, job_id: int, admin: dict[str, str]) -> list[dict[str, Any]]:
    return env.client.get(f"/v1/jobs/{job_id}/events", headers=admin).json()  # type: ignore[no-any-return]


# Real runs take a while on 2 cores: these run on SQLite only; `test_oom_bookkeeping.py` covers both databases.
@pytest.mark.slow
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_job_over_its_memory_budget_succeeds_after_one_replan(env: Env, admin: dict[str, str],
                                                                tmp_path: Path) -> None:
    created = env.client.post("/v1/jobs", json=oom_spec(replan=True), headers=admin)
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    first = env.client.get(f"/v1/jobs/{job_id}", headers=admin).json()["plan"]
    assert first["layout"]["micro_batch"] == 4  # what the budget cannot hold

    # The first dispatcher runs attempt 1 until it closes it and decides the re-plan, then "dies": the next
    # one (another owner) finds the job QUEUED with the new plan and submits it; nothing is decided twice.
    first_dispatcher = make_dispatcher(env, tmp_path)
    queued_again = drive(env, first_dispatcher, job_id, admin, until={"QUEUED", "SUCCEEDED", "FAILED"})
    assert queued_again["status"] == "QUEUED" and len(queued_again["attempts"]) == 1, queued_again
    closed = queued_again["attempts"][0]
    replay = Observation(state=RunState.FAILED, failure=FailureClass.OOM_GPU, exit_code=closed["exit_code"],
                         reason=closed["exit_reason"], log_tail=closed["log_tail"])
    assert first_dispatcher.apply(job_id, 1, replay) == 0  # a poll of the closed attempt again changes nothing
    job = drive(env, make_dispatcher(env, tmp_path, owner="restarted"), job_id, admin)
    assert job["status"] == "SUCCEEDED", job
    assert len(job["attempts"]) == 2, [e["message"] for e in events(env, job_id, admin) if "replan" in e["kind"]]
    first_attempt, second_attempt = job["attempts"]
    assert first_attempt["failure"] == "oom_gpu" and second_attempt["status"] == "SUCCEEDED"
    oom = measured_oom(first_attempt["log_tail"])
    assert oom is not None and oom.peak_bytes > int(BUDGET) and oom.limit_bytes == int(BUDGET)
    # The runtime's own report says so too, and each attempt ran its own layout.
    reports = [json.loads((tmp_path / a["backend_name"] / "out" / "report.json").read_text()) for a in job["attempts"]]
    assert reports[0]["status"] == "failed" and reports[0]["oom"]["failure"] == "oom_gpu"
    assert reports[0]["oom"]["peak_bytes"] > int(BUDGET) and reports[0]["error"]["type"] == "MemoryBudgetExceeded"
    assert reports[1]["status"] == "succeeded"

    replanned = [e for e in events(env, job_id, admin) if e["kind"] == "job.replanned"]
    assert len(replanned) == 1
    data = replanned[0]["data"]
    assert data["attempt"] == 1 and data["next_attempt"] == 2 and data["rung"] == "micro_batch"
    assert data["measured_peak_bytes"] == oom.peak_bytes and str(oom.peak_bytes) in replanned[0]["message"].replace(
        ",", "")
    assert data["old_layout"] == first["layout"]
    new = data["new_layout"]
    assert new == job["plan"]["layout"]  # the job's view shows the plan its current attempt runs
    assert (reports[0]["layout"], reports[1]["layout"]) == (data["old_layout"], new)
    assert new["micro_batch"] < 4 and new["dp"] * new["micro_batch"] * new["grad_accum_steps"] == 8
    assert data["new_predicted_bytes"] < data["cap_bytes"] <= data["predicted_bytes"]
    assert data["old"] == "ddp dp=2 tp=1 pp=1 cp=1 mb=4x1 ac=none" and data["old"] in replanned[0]["message"]
    assert data["new"] == job["layout"] and data["new"] in replanned[0]["message"]


@pytest.mark.slow
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_without_recovery_a_job_over_its_memory_budget_fails_as_before(env: Env, admin: dict[str, str],
                                                                       tmp_path: Path) -> None:
    created = env.client.post("/v1/jobs", json=oom_spec(replan=False), headers=admin)
    job_id = created.json()["id"]
    job = drive(env, make_dispatcher(env, tmp_path), job_id, admin)
    assert job["status"] == "FAILED"
    assert [a["failure"] for a in job["attempts"]] == ["oom_gpu"]
    kinds = [e["kind"] for e in events(env, job_id, admin)]
    assert "job.replanned" not in kinds and "job.replan_refused" not in kinds
    assert job["plan"]["layout"]["micro_batch"] == 4
