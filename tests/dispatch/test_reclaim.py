"""Reclaim end to end: through the API, the dispatcher's admission and the local backend with
a cpu pool. A team borrowing the whole pool runs the built-in runtime; the pool's owner submits; the
admission engine chooses the borrower as the victim, the dispatcher preempts it with notice, the
runtime checkpoints, the job goes back to the queue keeping its place, waits while the owner runs
(`explain` says why), then resumes from its checkpoint: its steps continue and add up to the spec's."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from service.scheduling.snapshot import SnapshotParams
from service.store.vocab import MeasurementKind
from tests.db_fixtures import Env
from tests.runtime.harness import spec_dict
from tests.specs import tiny
from tests.support.runtime_jobs import RUNTIME, beats, measurements
from workers.backends.local import LocalBackend
from workers.dispatch.context import DispatcherConfig
from workers.dispatcher import Dispatcher

STEPS = 40
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def get(env: Env, headers: dict[str, str], path: str) -> Any:
    r = env.client.get(path, headers=headers)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.slow
def test_an_owner_reclaims_its_quota_from_a_borrower_which_checkpoints_and_resumes(
        env: Env, admin: dict[str, str], live: str, tmp_path: Path) -> None:
    assert env.client.put("/v1/pools/local", json={"backend": "local", "gpu": "cpu", "gpus": 2},
                          headers=admin).status_code in (200, 201)
    for team, quota in {"owner": {"flavors": {"cpu": {"nominal": 2}}},
                        "borrower": {"flavors": {"cpu": {"nominal": 0, "borrowing_limit": 2}}}}.items():
        assert env.client.put(f"/v1/teams/{team}/quota", json=quota, headers=admin).status_code == 200
    owner = env.headers(env.token("member", team="owner"))
    borrower = env.headers(env.token("member", team="borrower"))

    spec = {**spec_dict(2, steps=STEPS), "name": "borrowed", "team": "borrower", "entrypoint": {"command": RUNTIME}}
    victim = env.client.post("/v1/jobs", json=spec, headers=borrower).json()["id"]
    dispatcher = Dispatcher(env.app.state.sessions, {"local": LocalBackend(tmp_path / "local")},
                            DispatcherConfig(api_url=live, retry_backoff_s=0.1, preempt_grace_s=60,
                                             scheduling=SnapshotParams(min_runtime_s=0)))
    deadline = time.monotonic() + 180
    while not beats(env, victim) or beats(env, victim)[-1] < 2:
        assert time.monotonic() < deadline, get(env, admin, f"/v1/jobs/{victim}")["status"]
        dispatcher.run_once()
        time.sleep(0.1)

    # the owner's job waits only for the borrower's notice: it needs the whole pool
    hold = tmp_path / "release-owner"
    code = f"import os, time\nwhile not os.path.exists({str(hold)!r}): time.sleep(0.1)"
    mine = env.client.post("/v1/jobs", headers=owner, json=tiny(
        name="mine", team="owner", resources={"gpus_per_node": 2},
        entrypoint={"command": ["python", "-c", code]})).json()["id"]
    deadline = time.monotonic() + 240
    while get(env, admin, f"/v1/jobs/{mine}")["status"] != "RUNNING":
        assert time.monotonic() < deadline, get(env, admin, f"/v1/jobs/{mine}")["status"]
        dispatcher.run_once()
        time.sleep(0.1)

    events = get(env, borrower, f"/v1/jobs/{victim}/events")
    preempted = [e for e in events if e["kind"] == "job.preempted"]
    # once, by the owner team's job: named by its team only, as the borrower reads it (no other team's job id)
    assert len(preempted) == 1 and preempted[0]["data"]["by"] is None and preempted[0]["data"]["by_team"] == "owner"
    assert f"job {mine}" not in preempted[0]["message"] and "a job of team owner" in preempted[0]["message"]
    assert "reclaim" in preempted[0]["data"]["reason"] and "owner" in preempted[0]["data"]["reason"]
    # back in the queue, and it says why it waits: the pool is the owner's now, and it borrows
    assert get(env, admin, f"/v1/jobs/{victim}")["status"] == "QUEUED"
    why = get(env, borrower, f"/v1/jobs/{victim}/explain")
    assert not why["admitted"] and why["position"]["pool"] == 1
    assert {r["code"] for r in why["reasons"]} & {"quota_exceeded", "waiting_for_capacity"}

    hold.write_text("")
    deadline = time.monotonic() + 300
    while get(env, admin, f"/v1/jobs/{victim}")["status"] not in TERMINAL:
        assert time.monotonic() < deadline, get(env, admin, f"/v1/jobs/{victim}")["status"]
        dispatcher.run_once()
        time.sleep(0.1)
    final = get(env, admin, f"/v1/jobs/{victim}")
    assert final["status"] == "SUCCEEDED", final
    assert get(env, admin, f"/v1/jobs/{mine}")["status"] == "SUCCEEDED"
    assert [a["failure"] for a in final["attempts"]] == ["preempted", None]
    assert beats(env, victim) == list(range(1, STEPS + 1))  # steps continue, none twice, none missing
    report = final["measurements"]["report"]["data"]
    assert 2 <= report["start_step"] < STEPS and report["start_step"] + report["steps"] == STEPS
    assert [r["status"] for r in measurements(env, victim, MeasurementKind.REPORT)] == ["preempted", "succeeded"]
