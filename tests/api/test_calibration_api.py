"""Calibration from measurements through the store and the API, on SQLite and PostgreSQL: reports
become samples once each, `GET /v1/calibration` and `shardctl calibrate` show the factors, later
submissions use them from the minimum on, and each job shows its own prediction error."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from service.planner.calibration import MEMORY_FACTOR_RANGE, STEP_FACTOR_RANGE, family
from service.planner.result import Plan
from service.store import calibration as store_calibration
from tests.db_fixtures import Env, app_env
from tests.reports import report
from tests.specs import tiny


def submit(env: Env, admin: dict[str, str], name: str) -> tuple[int, Plan]:
    r = env.client.post("/v1/jobs", json=tiny(name=name), headers=admin)
    assert r.status_code == 201, r.text
    body = r.json()
    return body["id"], Plan.model_validate(body["plan"])


def finish(env: Env, admin: dict[str, str], name: str, *, step: float, memory: float,
           status: str = "succeeded") -> tuple[int, Plan]:
    job_id, plan = submit(env, admin, name)
    r = env.client.post(f"/v1/jobs/{job_id}/measurements",
                        json={"kind": "report", "data": report(plan, step=step, memory=memory, status=status)},
                        headers=admin)
    assert r.status_code == 201, r.text
    return job_id, plan


@pytest.fixture
def fresh(env: Env) -> Env:
    """Submissions see a new run at once (the app otherwise rereads the store every 2 s)."""
    env.app.state.planner.calibration.ttl_s = 0.0
    return env


def calibration(env: Env, admin: dict[str, str]) -> dict[str, Any]:
    r = env.client.get("/v1/calibration", headers=admin)
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    return doc


def test_factors_follow_the_measurements_and_later_plans_use_them_from_the_minimum(
        fresh: Env, admin: dict[str, str]) -> None:
    env = fresh
    assert calibration(env, admin)["groups"] == []
    _, model_plan = finish(env, admin, "run-0", step=0.8, memory=0.9)
    for i in range(1, 4):
        finish(env, admin, f"run-{i}", step=0.8, memory=0.9)
    finish(env, admin, "crashed", step=5.0, memory=3.0, status="failed")  # failed runs do not count
    doc = calibration(env, admin)
    [group] = doc["groups"]
    assert (group["gpu"], group["family"], group["runs"]) == ("cpu", family(model_plan.layout), 4)
    assert group["step"]["value"] == pytest.approx(0.8) and not group["step"]["used"]
    assert group["memory"]["value"] == pytest.approx(0.9)
    assert group["step"]["error_before"] == pytest.approx(0.2) and group["step"]["error_after"] == pytest.approx(0)
    assert doc["min_runs"] == 5

    # Four runs: the next plan is the model's, and says why.
    _, planned = submit(env, admin, "next")
    assert planned.calibration is not None and not planned.calibration.used
    assert planned.time.step_s == pytest.approx(model_plan.time.step_s)

    # The fifth run (and one wild one, which does not move the median) and plans are calibrated: measured
    # faster than the model said, the same layout stays the choice at its measured pace.
    finish(env, admin, "run-4", step=0.8, memory=0.9)
    finish(env, admin, "stuck", step=40.0, memory=0.9)
    [group] = calibration(env, admin)["groups"]
    assert group["runs"] == 6 and group["step"]["used"]
    assert group["step"]["value"] == pytest.approx(0.8)
    _, planned = submit(env, admin, "calibrated")
    use = planned.calibration
    assert planned.layout == model_plan.layout
    assert use is not None and use.used and use.runs == 6
    assert use.step_factor == pytest.approx(0.8) and use.memory_factor == pytest.approx(0.9)
    assert planned.time.step_s == pytest.approx(0.8 * model_plan.time.step_s)
    assert use.model_step_s == pytest.approx(model_plan.time.step_s)


def test_a_calibrated_plans_run_counts_against_the_models_prediction(fresh: Env, admin: dict[str, str]) -> None:
    env = fresh
    for i in range(5):
        finish(env, admin, f"run-{i}", step=0.7, memory=1.0)
    job_id, planned = submit(env, admin, "calibrated")
    assert planned.calibration is not None and planned.calibration.step_factor == pytest.approx(0.7)
    # The runtime measured exactly what the calibrated plan said: 0.7 x the model.
    r = env.client.post(f"/v1/jobs/{job_id}/measurements",
                        json={"kind": "report", "data": report(planned, step=1.0, memory=1.0)}, headers=admin)
    assert r.status_code == 201
    [group] = calibration(env, admin)["groups"]
    assert group["runs"] == 6 and group["step"]["value"] == pytest.approx(0.7)
    job = env.client.get(f"/v1/jobs/{job_id}", headers=admin).json()
    assert job["prediction_error"]["step_ratio"] == pytest.approx(1.0)
    assert job["prediction_error"]["calibrated"] is True


def test_a_job_shows_its_own_prediction_error(env: Env, admin: dict[str, str]) -> None:
    job_id, plan = submit(env, admin, "quiet")
    assert env.client.get(f"/v1/jobs/{job_id}", headers=admin).json()["prediction_error"] is None
    r = env.client.post(f"/v1/jobs/{job_id}/measurements",
                        json={"kind": "report", "data": report(plan, step=1.25, memory=0.8)}, headers=admin)
    assert r.status_code == 201
    err = env.client.get(f"/v1/jobs/{job_id}", headers=admin).json()["prediction_error"]
    assert err["step_ratio"] == pytest.approx(1.25) and err["step_error"] == pytest.approx(0.25)
    assert err["memory_ratio"] == pytest.approx(0.8) and err["memory_error"] == pytest.approx(-0.2)
    assert err["predicted_step_s"] == pytest.approx(plan.time.step_s) and err["calibrated"] is False


def test_reports_are_read_once_however_often_calibration_is_read(env: Env, admin: dict[str, str]) -> None:
    for i in range(3):
        finish(env, admin, f"run-{i}", step=1.1, memory=1.0)
    sessions = env.app.state.sessions
    with sessions.begin() as session:
        assert store_calibration.refresh(session) == 3
    with sessions.begin() as session:
        assert store_calibration.refresh(session) == 0
        assert len(store_calibration.samples(session)) == 3
    finish(env, admin, "run-3", step=1.1, memory=1.0)
    with sessions.begin() as session:
        assert store_calibration.refresh(session) == 1
        assert len(store_calibration.samples(session, window=2)) == 2  # the newest per group only


def test_calibrate_and_show_print_the_factors_and_the_jobs_error(
        env: Env, admin: dict[str, str], admin_cli: Callable[..., tuple[int, str]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    code, out = admin_cli("calibrate")
    assert code == 0 and "no measured runs yet" in out
    for i in range(5):
        job_id, plan = finish(env, admin, f"run-{i}", step=1.2, memory=1.1)
    code, out = admin_cli("calibrate")
    assert code == 0, out
    assert family(plan.layout) in out and "x1.2" in out and "x1.1" in out
    assert "20.0% -> 0.0%" in out and "10.0% -> 0.0%" in out
    code, out = admin_cli("show", str(job_id))
    assert code == 0, out
    assert "Prediction error: step time +20.0%" in out and "peak memory +10.0%" in out


def test_replicas_reading_at_once_count_each_report_once(env: Env, admin: dict[str, str]) -> None:
    for i in range(12):
        finish(env, admin, f"run-{i}", step=1.1, memory=1.0)
    sessions = env.app.state.sessions
    errors: list[BaseException] = []

    def read() -> None:
        try:
            with sessions.begin() as session:
                store_calibration.current(session)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=read) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    [group] = calibration(env, admin)["groups"]
    assert group["runs"] == 12


def test_no_report_a_jobs_program_posts_breaks_planning_or_outweighs_other_jobs(
        fresh: Env, admin: dict[str, str]) -> None:
    """A job's own program holds its token and may post any report: one that is not a report, or whose
    figures are implausible (measured/predicted outside `PLAUSIBLE_RATIO`), gives no sample and planning
    goes on; a job posting many reports gives one sample; the report's own prediction and layout are
    never read, the job's stored plan is."""
    env = fresh
    job_id, plan = submit(env, admin, "forger")
    good = report(plan, step=1.0, memory=1.0)

    def post(job: int, data: dict[str, Any]) -> None:
        r = env.client.post(f"/v1/jobs/{job}/measurements", json={"kind": "report", "data": data}, headers=admin)
        assert r.status_code == 201, r.text

    r = env.client.post(f"/v1/jobs/{job_id}/measurements", headers=admin,
                        json={"kind": "report", "data": {**good, "measured": "fast"}})
    assert r.status_code == 422 and "data.measured" in r.text  # refused at the door, stored nowhere
    post(job_id, {**good, "measured": {"step_s": 5e-324, "peak": 5e-324}})
    post(job_id, {**good, "measured": {"step_s": good["measured"]["step_s"] * 1000, "peak": 1.0}})
    assert calibration(env, admin)["groups"] == []
    submit(env, admin, "still-planned")  # planning reads calibration on every submission here (ttl 0)

    forged = {**report(plan, step=2.0, memory=1.0), "layout": {"sharding": "zero3", "tp": 4},
              "predicted": {**good["predicted"], "step_s": 1e-6, "peak_allocated": 1.0}}
    post(job_id, forged)
    for _ in range(5):
        post(job_id, report(plan, step=3.0, memory=1.0))
    [group] = calibration(env, admin)["groups"]
    assert group["family"] == family(plan.layout) and group["runs"] == 1
    assert group["step"]["value"] == pytest.approx(2.0) and group["memory"]["value"] == pytest.approx(1.0)
    _, planned = submit(env, admin, "after")
    assert planned.calibration is not None and not planned.calibration.used


def post_report(env: Env, headers: dict[str, str], spec: dict[str, Any], *, step: float, memory: float) -> Plan:
    r = env.client.post("/v1/jobs", json=spec, headers=headers)
    assert r.status_code == 201, r.text
    planned, job_id = Plan.model_validate(r.json()["plan"]), r.json()["id"]
    job_token = env.headers(env.token("job", job_id=job_id))  # what the job's own program holds
    r = env.client.post(f"/v1/jobs/{job_id}/measurements", headers=job_token,
                        json={"kind": "report", "data": report(planned, step=step, memory=memory)})
    assert r.status_code == 201, r.text
    return planned


def plan_of(env: Env, headers: dict[str, str], spec: dict[str, Any]) -> dict[str, Any]:
    r = env.client.post("/v1/plans", json=spec, headers=headers)
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    return doc


def test_one_teams_forged_reports_leave_another_teams_plans_unchanged(fresh: Env) -> None:
    """Six jobs of team A each post a report measuring 99x the prediction: team B's plans, dry runs and
    submissions stay the model's; team A's own are calibrated within the factors' ranges."""
    env = fresh
    team_a = env.headers(env.token("member", team="team-a"))
    team_b = env.headers(env.token("member", team="team-b"))
    spec = tiny(name="same-run")
    before = plan_of(env, team_b, spec)
    plans = [post_report(env, team_a, spec, step=99.0, memory=99.0) for _ in range(6)]
    first = plans[0]
    after = plan_of(env, team_b, spec)
    assert after["layout"] == before["layout"] and after["fits"]
    assert after["time"]["step_s"] == before["time"]["step_s"]
    assert after["calibration"]["used"] is False and after["calibration"]["runs"] == 0
    r = env.client.post("/v1/jobs", json=spec, headers=team_b)
    assert r.status_code == 201 and r.json()["plan"]["time"]["step_s"] == before["time"]["step_s"]
    assert calibration(env, team_b)["groups"] == [] and calibration(env, team_b)["team"] == "team-b"

    doc = calibration(env, team_a)
    [group] = [g for g in doc["groups"] if g["family"] == family(first.layout)]
    assert doc["team"] == "team-a" and group["runs"] >= 5
    assert group["step"]["value"] == STEP_FACTOR_RANGE[1] and group["step"]["capped"]
    assert group["memory"]["value"] == MEMORY_FACTOR_RANGE[1] and group["memory"]["capped"]
    own = plan_of(env, team_a, spec)
    assert own["calibration"]["used"] and own["calibration"]["memory_factor"] <= MEMORY_FACTOR_RANGE[1]
    # A member reads only their own team's factors; an admin names the team.
    assert env.client.get("/v1/calibration", params={"team": "team-a"}, headers=team_b).status_code == 403
    admin = env.headers(env.token("admin"))
    assert env.client.get("/v1/calibration", params={"team": "team-a"}, headers=admin).json()["groups"]


def test_an_admin_may_let_every_teams_runs_calibrate_every_plan(db_url: str, tmp_path: Any) -> None:
    with app_env(db_url, tmp_path, calibration_scope="all") as env:
        env.app.state.planner.calibration.ttl_s = 0.0
        team_a = env.headers(env.token("member", team="team-a"))
        team_b = env.headers(env.token("member", team="team-b"))
        spec = tiny(name="same-run")
        before = plan_of(env, team_b, spec)
        for _ in range(5):
            post_report(env, team_a, spec, step=0.8, memory=1.0)
        after = plan_of(env, team_b, spec)
        assert after["calibration"]["used"] and after["calibration"]["step_factor"] == pytest.approx(0.8)
        assert after["time"]["step_s"] == pytest.approx(0.8 * before["time"]["step_s"])
        doc = calibration(env, team_b)
        assert doc["team"] is None and doc["scope"] == "all"
