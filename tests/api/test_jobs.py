"""Jobs through the API: submit, idempotency, refusal, listing, details, cancel, events (both databases)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from sqlalchemy import text

from service.api.views import detail_out, job_out, job_summary
from service.failures import FailureClass
from service.planner import Plan
from service.store.db import one_statement
from service.store.jobs import job_detail, visible_job
from service.store.models import Attempt, Job, Measurement
from service.store.states import JobStatus, transition
from service.store.tokens import Principal
from service.store.vocab import AttemptStatus, MeasurementKind, Role
from tests.db_fixtures import Env
from tests.reports import report
from tests.specs import tiny
from tests.statement_log import statements


def submit(env: Env, headers: dict[str, str], spec: dict, key: str | None = None):  # type: ignore[no-untyped-def]
    extra = {"Idempotency-Key": key} if key else {}
    return env.client.post("/v1/jobs", json=spec, headers={**headers, **extra})


def test_submit_plans_and_queues(env: Env, admin: dict[str, str]) -> None:
    env.client.post("/v1/teams", json={"name": "alpha"}, headers=admin)
    r = submit(env, admin, tiny(team="alpha"))
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["status"] == "QUEUED" and job["team"] == "alpha" and job["backend"] == "local"
    layout = job["plan"]["layout"]
    assert job["plan"]["fits"] and layout["dp"] * layout["tp"] * layout["pp"] * layout["cp"] == 2  # both CPUs
    assert job["spec"]["team"] == "alpha" and job["predicted_step_s"] > 0
    events = env.client.get(f"/v1/jobs/{job['id']}/events", headers=admin).json()
    assert [e["kind"] for e in events] == ["job.queued"]
    # The 201 is rendered from the inserted row without a read back: it is the job as any read gives it.
    assert job == env.client.get(f"/v1/jobs/{job['id']}", headers=admin).json()


def test_a_submission_is_two_or_three_statements_the_team_with_the_token_check_then_the_job_and_its_event(
        env: Env, admin: dict[str, str]) -> None:
    """What a submission costs the database, the number that bounds submissions per second: in one
    transaction one read of the team (with its quota, whether a webhook gets its events, and the
    pools), then the job and its event: one INSERT each, or on PostgreSQL one statement for both (a
    data-modifying CTE). A token's first submission looks it up first; later ones check it in the
    team's read (`known_tokens.TOKEN_LIVE`). With an `Idempotency-Key` the token is looked up first, then
    the key, and the key is one INSERT more."""
    warm = env.headers(env.token("member", team="alpha"))
    assert submit(env, warm, tiny(name="warm")).status_code == 201  # plans it: the next ones hit the cache
    member = env.headers(env.token("member", team="alpha"))
    writes = ["INSERT jobs+events"] if env.url.startswith("postgresql") else ["INSERT jobs", "INSERT events"]
    with statements(env) as seen:
        assert submit(env, member, tiny(name="first")).status_code == 201
        first = list(seen)
        seen.clear()
        assert submit(env, member, tiny(name="counted", priority=1)).status_code == 201
        plain = list(seen)
        seen.clear()
        assert submit(env, member, tiny(name="keyed"), key="k-1").status_code == 201
    assert first == ["SELECT api_tokens", "SELECT teams", *writes]
    assert plain == ["SELECT teams", *writes]
    assert seen == ["SELECT api_tokens", "SELECT idempotency_keys", "SELECT teams", *writes, "INSERT idempotency_keys"]


def test_a_job_read_is_one_statement_on_postgresql_the_job_with_its_attempts_measurements_and_token_check(
        env: Env, admin: dict[str, str]) -> None:
    """`GET /v1/jobs/{id}`, the read every dashboard and script polls: on PostgreSQL one statement for
    the job, its team's name, its attempts and its newest measurements; on SQLite three. The first read
    with a token checks it in a statement of its own; later reads check it in the job's statement
    (`known_tokens.TOKEN_LIVE`)."""
    job_id = submit(env, admin, tiny()).json()["id"]
    reader = env.headers(env.token("admin"))
    reads = ["SELECT jobs"] if env.url.startswith("postgresql") else ["SELECT jobs", "SELECT attempts",
                                                                       "SELECT measurements"]
    with statements(env) as seen:
        assert env.client.get(f"/v1/jobs/{job_id}", headers=reader).status_code == 200
        first = list(seen)
        seen.clear()
        assert env.client.get(f"/v1/jobs/{job_id}", headers=reader).status_code == 200
    assert first == ["SELECT api_tokens", *reads]
    assert seen == reads


def test_same_key_same_body_returns_the_first_job(env: Env, admin: dict[str, str]) -> None:
    first = submit(env, admin, tiny(), key="abc")
    again = submit(env, admin, tiny(), key="abc")
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    assert len(env.client.get("/v1/jobs", headers=admin).json()["items"]) == 1


def test_same_key_different_body_is_a_conflict(env: Env, admin: dict[str, str]) -> None:
    assert submit(env, admin, tiny(), key="abc").status_code == 201
    r = submit(env, admin, tiny(name="other"), key="abc")
    assert r.status_code == 409
    assert r.json()["error"]["code"] == "conflict" and "different body" in r.json()["error"]["message"]


def test_a_spec_that_does_not_fit_is_refused_with_reasons(env: Env, admin: dict[str, str]) -> None:
    spec = tiny(model={"preset": "llama-3.1-405b"}, resources={"gpu": "H100-SXM-80GB", "gpus_per_node": 8})
    r = submit(env, admin, spec)
    assert r.status_code == 422
    error = r.json()["error"]
    assert error["code"] == "does_not_fit" and error["details"]["reasons"]
    assert error["details"]["min_gpus_to_fit"] > 8
    assert env.client.get("/v1/jobs", headers=admin).json()["items"] == []


def test_validation_errors_name_each_field(env: Env, admin: dict[str, str]) -> None:
    r = submit(env, admin, tiny(training={"global_batch": -1, "precision": "int4"}))
    assert r.status_code == 422
    error = r.json()["error"]
    assert error["code"] == "invalid_spec"  # the same code as the planner's own checks below
    assert {f["loc"] for f in error["fields"]} >= {"training.global_batch", "training.precision"}


def test_planner_errors_name_the_field(env: Env, admin: dict[str, str]) -> None:
    r = submit(env, admin, tiny(resources={"gpu": "H900"}))
    assert r.status_code == 422
    assert r.json()["error"]["code"] == "invalid_spec"
    assert r.json()["error"]["fields"][0]["loc"] == "resources.gpu"


def test_dry_run_plan_creates_no_job(env: Env, admin: dict[str, str]) -> None:
    r = env.client.post("/v1/plans", json=tiny(), headers=admin)
    assert r.status_code == 200 and r.json()["fits"]
    assert env.client.get("/v1/jobs", headers=admin).json()["items"] == []


def test_list_is_newest_first_with_filters_and_cursor(env: Env, admin: dict[str, str]) -> None:
    for team in ("alpha", "beta"):
        env.client.post("/v1/teams", json={"name": team}, headers=admin)
    ids = [submit(env, admin, tiny(name=f"job-{i}", team="alpha" if i % 2 else "beta")).json()["id"]
           for i in range(7)]
    page = env.client.get("/v1/jobs", params={"limit": 3}, headers=admin).json()
    assert [j["id"] for j in page["items"]] == ids[::-1][:3]
    seen = [j["id"] for j in page["items"]]
    while page["next_cursor"]:
        page = env.client.get("/v1/jobs", params={"limit": 3, "cursor": page["next_cursor"]}, headers=admin).json()
        seen += [j["id"] for j in page["items"]]
    assert seen == ids[::-1]
    alpha = env.client.get("/v1/jobs", params={"team": "alpha"}, headers=admin).json()["items"]
    assert {j["team"] for j in alpha} == {"alpha"} and len(alpha) == 3
    assert [j["name"] for j in env.client.get("/v1/jobs", params={"name": "job-4"}, headers=admin)
            .json()["items"]] == ["job-4"]
    env.client.post(f"/v1/jobs/{ids[0]}/cancel", headers=admin)
    cancelled = env.client.get("/v1/jobs", params={"status": "CANCELLED"}, headers=admin).json()["items"]
    assert [j["id"] for j in cancelled] == [ids[0]]
    both = env.client.get("/v1/jobs", params=[("status", "CANCELLED"), ("status", "QUEUED")], headers=admin)
    assert len(both.json()["items"]) == 7
    assert env.client.get("/v1/jobs", params={"backend": "slurm"}, headers=admin).json()["items"] == []


def test_bad_list_parameters_are_422(env: Env, admin: dict[str, str]) -> None:
    assert env.client.get("/v1/jobs", params={"status": "DONE"}, headers=admin).status_code == 422
    assert env.client.get("/v1/jobs", params={"cursor": "abc"}, headers=admin).status_code == 422
    assert env.client.get("/v1/jobs", params={"limit": 1000}, headers=admin).status_code == 422


def _force(env: Env, job_id: int, *path: JobStatus) -> None:
    with env.app.state.sessions.begin() as session:
        job = session.get(Job, job_id)
        for status in path:
            transition(session, job, status, actor="test")


def test_cancel_queued_is_immediate_and_idempotent(env: Env, admin: dict[str, str]) -> None:
    job_id = submit(env, admin, tiny()).json()["id"]
    for _ in range(2):
        r = env.client.post(f"/v1/jobs/{job_id}/cancel", headers=admin)
        assert r.status_code == 200 and r.json()["status"] == "CANCELLED"
    kinds = [e["kind"] for e in env.client.get(f"/v1/jobs/{job_id}/events", headers=admin).json()]
    assert kinds == ["job.queued", "job.cancelled"]


def test_cancel_running_moves_to_cancelling(env: Env, admin: dict[str, str]) -> None:
    job_id = submit(env, admin, tiny()).json()["id"]
    _force(env, job_id, JobStatus.SUBMITTING, JobStatus.PENDING, JobStatus.RUNNING)
    assert env.client.post(f"/v1/jobs/{job_id}/cancel", headers=admin).json()["status"] == "CANCELLING"
    assert env.client.post(f"/v1/jobs/{job_id}/cancel", headers=admin).json()["status"] == "CANCELLING"


def test_cancel_of_a_finished_job_changes_nothing(env: Env, admin: dict[str, str]) -> None:
    job_id = submit(env, admin, tiny()).json()["id"]
    _force(env, job_id, JobStatus.SUBMITTING, JobStatus.RUNNING, JobStatus.SUCCEEDED)
    assert env.client.post(f"/v1/jobs/{job_id}/cancel", headers=admin).json()["status"] == "SUCCEEDED"


def test_job_details_carry_attempts_and_latest_measurements(env: Env, admin: dict[str, str]) -> None:
    job_id = submit(env, admin, tiny()).json()["id"]
    job_token = env.headers(env.token("job", job_id=job_id))
    for step in (1, 2):
        r = env.client.post(f"/v1/jobs/{job_id}/measurements", json={"kind": "heartbeat", "data": {"step": step}},
                            headers=job_token)
        assert r.status_code == 201
    env.client.post(f"/v1/jobs/{job_id}/measurements", json={"kind": "report", "data": {"step_s": 1.5}},
                    headers=job_token)
    job = env.client.get(f"/v1/jobs/{job_id}", headers=admin).json()
    assert job["measurements"]["heartbeat"]["data"] == {"step": 2}
    assert job["measurements"]["report"]["data"] == {"step_s": 1.5}
    assert job["attempts"] == []
    kinds = [e["kind"] for e in env.client.get(f"/v1/jobs/{job_id}/events", headers=admin).json()]
    assert kinds == ["job.queued", "job.report"]  # heartbeats are measurements, not events


def test_events_after_and_sse_stream_until_terminal(env: Env, admin: dict[str, str]) -> None:
    job_id = submit(env, admin, tiny()).json()["id"]
    _force(env, job_id, JobStatus.SUBMITTING, JobStatus.PENDING, JobStatus.RUNNING, JobStatus.SUCCEEDED)
    events = env.client.get(f"/v1/jobs/{job_id}/events", headers=admin).json()
    assert [e["kind"] for e in events] == ["job.queued", "job.submitting", "job.pending", "job.running",
                                           "job.succeeded"]
    later = env.client.get(f"/v1/jobs/{job_id}/events", params={"after": events[2]["id"]}, headers=admin).json()
    assert [e["kind"] for e in later] == ["job.running", "job.succeeded"]
    with env.client.stream("GET", f"/v1/jobs/{job_id}/events", headers={**admin, "Accept": "text/event-stream"}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        body = "".join(r.iter_text())
    data = [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: {\"")]
    assert [d["kind"] for d in data] == [e["kind"] for e in events]
    assert body.rstrip().endswith("event: end\ndata: {}")


def test_a_list_page_shows_each_job_as_its_summary(env: Env, admin: dict[str, str]) -> None:
    """`GET /v1/jobs` validates its page from the list's rows in one call (`job_page`); each item is
    what `job_summary` makes of the same job through the ORM, finished or not."""
    ids = [submit(env, admin, tiny(name=f"listed-{i}")).json()["id"] for i in range(3)]
    _force(env, ids[0], JobStatus.SUBMITTING, JobStatus.RUNNING, JobStatus.FAILED)
    page = env.client.get("/v1/jobs", params={"limit": "2"}, headers=admin).json()
    rest = env.client.get("/v1/jobs", params={"cursor": page["next_cursor"]}, headers=admin).json()
    assert rest["next_cursor"] is None
    with env.app.state.sessions.begin() as session:
        jobs = [visible_job(session, Principal(token_id="admin", role=Role.ADMIN), i) for i in reversed(ids)]
        assert page["items"] + rest["items"] == [job_summary(j, j.team.name).model_dump(mode="json") for j in jobs]
    assert page["items"][0]["finished_at"] is None and rest["items"][0]["finished_at"] is not None


def test_unknown_job_is_404(env: Env, admin: dict[str, str]) -> None:
    r = env.client.get("/v1/jobs/999", headers=admin)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def test_an_unknown_team_is_not_created_by_a_submission(env: Env, admin: dict[str, str]) -> None:
    r = submit(env, admin, tiny(team="typo"))
    assert r.status_code == 404 and "POST /v1/teams" in r.json()["error"]["message"]
    assert submit(env, admin, tiny()).json()["team"] == "default"


def test_a_plan_the_built_in_trainer_cannot_run_is_refused_before_it_is_queued(env: Env, admin: dict[str, str]
                                                                               ) -> None:
    """Llama-2-7B with AdamW on one H100 fits only with the optimizer offloaded, which the built-in
    trainer does not implement: refused naming the field and the fix. A user's own program may
    implement offload, so the same spec with an entrypoint is queued."""
    assert env.client.put("/v1/pools/h100", json={"backend": "local", "gpu": "H100-SXM-80GB", "gpus": 8},
                          headers=admin).status_code == 201
    spec = tiny(model={"preset": "llama-2-7b"},
                training={"global_batch": 8, "precision": "bf16", "optimizer": "adamw", "steps": 5},
                resources={"gpu": "H100-SXM-80GB", "gpus_per_node": 1, "nodes": 1})
    r = submit(env, admin, spec)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "needs_runtime_support"
    assert [f["loc"] for f in error["fields"]] == ["layout.offload"]
    assert "more GPUs" in error["message"] and "entrypoint.command" in error["message"]
    assert error["details"]["gaps"] == ["offload"]
    assert env.client.get("/v1/jobs", headers=admin).json()["items"] == []
    own = submit(env, admin, {**spec, "entrypoint": {"command": ["python", "train.py"]}})
    assert own.status_code == 201, own.text
    assert own.json()["plan"]["layout"]["offload"] != "none"


def test_a_job_read_shows_its_attempts_in_order_and_the_newest_measurement_of_each_kind(
        env: Env, admin: dict[str, str]) -> None:
    """`GET /v1/jobs/{id}` reads Core rows (`job_detail`: on PostgreSQL one statement, its attempts and
    measurements as JSON); the dashboard's job page reads the same job through the ORM (`job_out`).
    Both show the same, to the microsecond in any session time zone: attempts by number, the newest
    measurement of each kind, the prediction error of the newest report; and another team's member
    gets a 404."""
    env.client.post("/v1/teams", json={"name": "alpha"}, headers=admin)
    submitted = submit(env, admin, tiny(team="alpha")).json()
    job_id, planned = submitted["id"], Plan.model_validate(submitted["plan"])
    with env.app.state.sessions.begin() as session:
        session.add_all([
            Attempt(job_id=job_id, number=2, backend_name="local", backend_id="b", nodes=["n2"],
                    status=AttemptStatus.RUNNING),
            Attempt(job_id=job_id, number=1, backend_name="local", backend_id="a", nodes=["n1"],
                    status=AttemptStatus.FAILED, exit_code=3, exit_reason="exit 3", failure=FailureClass.PROGRAM_ERROR,
                    log_tail="Traceback", created_at=datetime(2026, 12, 6, 5, 59, 58, 120000, tzinfo=UTC),
                    finished_at=datetime(2026, 12, 6, 6, 0, 1, 7, tzinfo=UTC)),
            Measurement(job_id=job_id, kind=MeasurementKind.HEARTBEAT, data={"step": 1}),
            Measurement(job_id=job_id, kind=MeasurementKind.REPORT, data=report(planned, step=3.0, memory=1.0)),
            Measurement(job_id=job_id, kind=MeasurementKind.HEARTBEAT, data={"step": 2}),
        ])
    read = env.client.get(f"/v1/jobs/{job_id}", headers=admin)
    assert read.status_code == 200 and read.headers["content-type"] == "application/json"
    job = read.json()
    assert [(a["number"], a["backend_id"], a["nodes"]) for a in job["attempts"]] == [(1, "a", ["n1"]), (2, "b", ["n2"])]
    assert job["attempts"][0]["failure"] == "program_error" and job["attempts"][0]["exit_code"] == 3
    assert job["measurements"]["heartbeat"]["data"] == {"step": 2}
    assert job["prediction_error"]["step_ratio"] == pytest.approx(3.0)
    with env.app.state.sessions.begin() as session:
        principal = Principal(token_id="admin", role=Role.ADMIN)
        assert job == job_out(session, visible_job(session, principal, job_id, detail=True)).model_dump(mode="json")
    assert job["attempts"][0]["finished_at"] == "2026-12-06T06:00:01.000007Z"
    if env.url.startswith("postgresql"):  # its one statement's JSON times, read in another time zone
        with one_statement(env.app.state.engine) as conn:
            conn.execute(text("SET TIME ZONE 'Asia/Kolkata'"))
            assert detail_out(job_detail(conn, principal, job_id)).model_dump(mode="json") == job
    other = env.headers(env.token("member", team="beta"))
    assert env.client.get(f"/v1/jobs/{job_id}", headers=other).status_code == 404


@pytest.mark.parametrize("key", ["", "k" * 201])
def test_an_idempotency_key_outside_its_documented_length_is_a_422_naming_the_header(
        env: Env, admin: dict[str, str], key: str) -> None:
    r = env.client.post("/v1/jobs", json=tiny(name="keyed"), headers={**admin, "Idempotency-Key": key})
    assert r.status_code == 422, r.text[:300]
    assert [f["loc"] for f in r.json()["error"]["fields"]] == ["header.idempotency-key"]
    assert env.client.get("/v1/jobs", headers=admin).json()["items"] == []
    schema = env.client.get("/openapi.json").json()["paths"]["/v1/jobs"]["post"]["parameters"]
    [header] = [p for p in schema if p["name"] == "idempotency-key"]
    assert (header["schema"]["anyOf"][0]["minLength"], header["schema"]["anyOf"][0]["maxLength"]) == (1, 200)
