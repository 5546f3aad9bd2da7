"""Out-of-memory re-plans as the dispatcher records them, on SQLite and PostgreSQL: a real local program that
reports running out of memory (the runtime's own line, with a peak over what its plan predicted) while its
micro-batch is over 1 is re-planned up to `recovery.max_replans` times, each re-plan an event, without
spending `max_attempts`; then `job.replan_refused` says why and the job fails."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from service.failures import FailureClass
from tests.db_fixtures import Env
from tests.specs import tiny
from tests.support.dispatch import drive, make_dispatcher
from workers.backends.base import Observation, RunState
from workers.dispatch import reconcile
from workers.dispatch.context import Context

#: One process (no torchrun): out of memory, as the runtime reports it, while the plan's micro-batch is over 1;
#: the peak is 5% under the plan's predicted tensor bytes (the model over-predicted) and the limit 10% under them.
OOM_UNLESS_MB1 = """
import json, os, sys
plan = json.loads(os.environ["SHARDCTL_PLAN_JSON"])
m = plan["memory"]
predicted = m["total"] - m["runtime_overhead"] - m["allocator_margin"]
print("micro_batch", plan["layout"]["micro_batch"], flush=True)
if plan["layout"]["micro_batch"] > 1:
    print(f"shardctl: out of memory (oom_gpu) on rank 0: peak {int(predicted * 0.95)} bytes,"
          f" limit {int(predicted * 0.9)} bytes (test)", file=sys.stderr, flush=True)
    sys.exit(1)
"""


def spec(max_replans: int) -> dict[str, Any]:
    return tiny(resources={"gpus_per_node": 1},
                entrypoint={"command": ["python", "-c", OOM_UNLESS_MB1]},
                recovery={"replan_on_oom": True, "max_replans": max_replans})


def events(env: Env, job_id: int, admin: dict[str, str]) -> list[dict[str, Any]]:
    return env.client.get(f"/v1/jobs/{job_id}/events", headers=admin).json()  # type: ignore[no-any-return]


def test_replans_stop_at_max_replans_and_do_not_spend_max_attempts(env: Env, admin: dict[str, str],
                                                                    tmp_path: Path) -> None:
    created = env.client.post("/v1/jobs", json=spec(max_replans=1), headers=admin)
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    first_mb = env.client.get(f"/v1/jobs/{job_id}", headers=admin).json()["plan"]["layout"]["micro_batch"]
    assert first_mb > 2  # two re-plans needed at least to reach micro-batch 1
    job = drive(env, make_dispatcher(env, tmp_path, max_attempts=1), job_id, admin)
    assert job["status"] == "FAILED", job
    assert [a["failure"] for a in job["attempts"]] == ["oom_gpu", "oom_gpu"]  # max_attempts=1 did not stop it

    history = events(env, job_id, admin)
    replanned = [e for e in history if e["kind"] == "job.replanned"]
    refused = [e for e in history if e["kind"] == "job.replan_refused"]
    assert len(replanned) == 1 and len(refused) == 1
    data = replanned[0]["data"]
    assert data["old_layout"]["micro_batch"] == first_mb and data["new_layout"]["micro_batch"] > 1
    # the cap: 0.9 of the prediction (the limit), the model having over-predicted (scale 1)
    assert data["cap_bytes"] == int(data["predicted_bytes"] * 0.9) and data["scale"] == 1.0
    assert data["new_predicted_bytes"] < data["cap_bytes"]
    assert data["measured_peak_bytes"] == int(data["predicted_bytes"] * 0.95)
    assert (data["replan"], data["max_replans"], data["next_attempt"]) == (1, 1, 2)
    assert refused[0]["data"]["attempt"] == 2 and refused[0]["data"]["replans"] == 1
    assert "recovery.max_replans (1)" in refused[0]["message"]
    assert refused[0]["data"]["layout"] == data["new_layout"]
    assert history[-1]["kind"] == "job.failed" and history[-1]["data"]["failure"] == "oom_gpu"


def test_enough_replans_reach_a_layout_that_runs(env: Env, admin: dict[str, str], tmp_path: Path) -> None:
    created = env.client.post("/v1/jobs", json=spec(max_replans=10), headers=admin)
    job_id = created.json()["id"]
    job = drive(env, make_dispatcher(env, tmp_path, max_attempts=1), job_id, admin)
    assert job["status"] == "SUCCEEDED", job
    replanned = [e["data"] for e in events(env, job_id, admin) if e["kind"] == "job.replanned"]
    assert len(replanned) == len(job["attempts"]) - 1 >= 1
    assert job["plan"]["layout"]["micro_batch"] == 1 == replanned[-1]["new_layout"]["micro_batch"]
    for before, after in pairwise(replanned):
        assert after["old_layout"] == before["new_layout"]  # each attempt ran the layout decided before it
        assert after["predicted_bytes"] == before["new_predicted_bytes"]


def test_an_out_of_memory_end_is_applied_in_a_transaction_of_its_own(env: Env, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Its re-plan runs the planner while its job's row is locked: the other jobs of the chunk commit
    first, together, and each out-of-memory end alone (a failing one does not stop the rest)."""
    dispatcher = make_dispatcher(env, tmp_path)
    calls: list[list[int]] = []

    def record(ctx: Context, observed: list[tuple[int, int, Observation]]) -> int:
        calls.append([job_id for job_id, _, _ in observed])
        if observed[0][0] == 3:
            raise RuntimeError("the store refused job 3")
        return len(observed)

    monkeypatch.setattr(reconcile, "_apply_in_one_transaction", record)
    ended = Observation(state=RunState.SUCCEEDED, exit_code=0)
    oom = Observation(state=RunState.FAILED, exit_code=1, failure=FailureClass.OOM_GPU)
    observed = [(1, 1, ended), (2, 1, oom), (3, 1, oom.model_copy(update={"failure": FailureClass.OOM_HOST})),
                (4, 1, ended), (5, 1, oom)]
    assert dispatcher.apply_many(observed) == 2 + 1 + 1
    assert calls == [[1, 4], [2], [3], [5]]
