"""Team quotas through the API and the dispatcher on the local backend with a cpu pool:
a team over its quota waits and runs once its first job ends, a team borrows from an idle one, and
`GET /v1/jobs/{id}/explain` says why, with positions, naming only the caller's own team's jobs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.db_fixtures import Env
from tests.support.quotas import program, setup, submit
from workers.backends.local import LocalBackend
from workers.dispatch.context import DispatcherConfig
from workers.dispatcher import Dispatcher

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def until_file(path: Path) -> str:
    return f"import os, time\nwhile not os.path.exists({str(path)!r}): time.sleep(0.1)"


def status(env: Env, admin: dict[str, str], job_id: int) -> str:
    return str(env.client.get(f"/v1/jobs/{job_id}", headers=admin).json()["status"])


def drive(env: Env, d: Dispatcher, admin: dict[str, str], job_id: int, until: set[str],
          timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        d.run_once()
        if status(env, admin, job_id) in until:
            return
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} stuck in {status(env, admin, job_id)}")


def metrics(env: Env) -> dict[str, float]:
    """`/metrics` as {series with labels: value} (teams summed away, as by default)."""
    text = env.client.get("/metrics").text
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def explain(env: Env, headers: dict[str, str], job_id: int) -> dict[str, Any]:
    r = env.client.get(f"/v1/jobs/{job_id}/explain", headers=headers)
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_a_team_over_its_quota_waits_and_runs_after_its_first_job(env: Env, admin: dict[str, str],
                                                                  tmp_path: Path) -> None:
    members = setup(env, admin, 2, {"alpha": {"flavors": {"cpu": {"nominal": 1, "borrowing_limit": 0}}}})
    release = tmp_path / "release"
    first = submit(env, members["alpha"], program(until_file(release), team="alpha", name="first"))
    second = submit(env, members["alpha"], program("pass", team="alpha", name="second"))
    d = Dispatcher(env.app.state.sessions, {"local": LocalBackend(tmp_path / "local")},
                   DispatcherConfig(retry_backoff_s=0.1))
    drive(env, d, admin, first, {"RUNNING"})
    for _ in range(3):
        d.run_once()
    assert status(env, admin, second) == "QUEUED"  # the pool has room; alpha's quota does not
    why = explain(env, members["alpha"], second)
    assert why["admitted"] is False and why["status"] == "QUEUED"
    codes = {r["code"]: r for r in why["reasons"]}
    assert "quota_exceeded" in codes and codes["quota_exceeded"]["flavor"] == "cpu", why
    assert codes["quota_exceeded"]["requested"] == 1
    assert "running" in explain(env, members["alpha"], first)["note"]
    usage = env.client.get("/v1/teams/alpha/usage", headers=members["alpha"]).json()
    assert usage["admitted"] == {"cpu": 1} and usage["borrowed"] == {"cpu": 0}
    assert usage["waiting"] == {"cpu": {"jobs": 1, "gpus": 1}}
    release.write_text("go")
    drive(env, d, admin, first, TERMINAL)
    drive(env, d, admin, second, TERMINAL)
    assert status(env, admin, first) == status(env, admin, second) == "SUCCEEDED"
    used = env.client.get("/v1/teams/alpha/usage", headers=members["alpha"]).json()["gpu_seconds"]
    assert used.get("cpu", 0) > 0  # the first job was seen running, so it counts
    # both ended: the database's aggregate and the API's sum agree
    assert abs(metrics(env)['shardctl_gpu_usage_seconds_total{gpu="cpu"}'] - used["cpu"]) < 0.01


def test_a_team_borrows_what_an_idle_team_lends(env: Env, admin: dict[str, str], tmp_path: Path) -> None:
    members = setup(env, admin, 2, {"alpha": {"flavors": {"cpu": {"nominal": 1, "borrowing_limit": 1}}},
                                    "beta": {"flavors": {"cpu": {"nominal": 1}}}})
    jobs = [submit(env, members["alpha"], program("pass", team="alpha", name=f"a{i}")) for i in range(3)]
    d = Dispatcher(env.app.state.sessions, {"local": LocalBackend(tmp_path / "local")}, DispatcherConfig())
    assert d.lease() == jobs[:2]  # its own GPU and beta's idle one; the third is past its borrowing limit
    usage = env.client.get("/v1/teams/alpha/usage", headers=members["alpha"]).json()
    assert usage["admitted"] == {"cpu": 2} and usage["borrowed"] == {"cpu": 1}
    assert {r["code"] for r in explain(env, members["alpha"], jobs[2])["reasons"]} >= {"quota_exceeded"}
    scraped = metrics(env)
    assert scraped['shardctl_gpus_admitted{gpu="cpu"}'] == 2 and scraped['shardctl_gpus_borrowed{gpu="cpu"}'] == 1
    assert scraped['shardctl_pending_gpus{gpu="cpu"}'] == 1 and scraped['shardctl_pending_jobs{gpu="cpu"}'] == 1
    assert scraped['shardctl_gpu_quota{gpu="cpu",limit="nominal"}'] == 2  # summed over teams
    assert scraped['shardctl_admission_wait_seconds{gpu="cpu"}'] >= 0


def test_explain_gives_reasons_and_positions_and_names_only_the_callers_team(env: Env, admin: dict[str, str],
                                                                            tmp_path: Path) -> None:
    members = setup(env, admin, 2, {})
    big = submit(env, members["gamma"], program("pass", team="gamma", slots=2, name="big"))
    d = Dispatcher(env.app.state.sessions, {"local": LocalBackend(tmp_path / "local")}, DispatcherConfig())
    assert d.lease() == [big]  # admitted: it holds the whole pool
    b = submit(env, members["alpha"], program("pass", team="alpha", name="b"))
    c = submit(env, members["beta"], program("pass", team="beta", name="c"))
    last = submit(env, members["alpha"], program("pass", team="alpha", name="d"))
    why = explain(env, members["alpha"], last)
    assert why["admitted"] is False
    assert "waiting_for_capacity" in {r["code"] for r in why["reasons"]}, why
    assert why["position"] == {"team": 2, "pool": 3}
    assert [a["job_id"] for a in why["ahead"]] == [b]  # its own team's job, named
    assert why["ahead_other_teams"] == {"jobs": 1, "gpus": 1}  # beta's, counted, not named
    assert str(c) not in str(why["ahead"])
    assert [a["job_id"] for a in explain(env, admin, last)["ahead"]] == [b, c]  # an admin sees every one
    assert why["eta"] is not None and why["eta"]["method"]
    held = explain(env, members["gamma"], big)
    assert held["admitted"] is True and held["pool"] == "local"
    assert env.client.get(f"/v1/jobs/{last}/explain", headers=members["beta"]).status_code == 404
    assert env.client.get("/v1/jobs/424242/explain", headers=admin).status_code == 404
