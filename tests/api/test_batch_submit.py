"""`POST /v1/jobs:batch`: all or nothing, per-item errors by index and field, same rules as one
submission, one transaction (both databases)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from service.api import submission
from service.api.submission import MAX_BATCH
from service.scheduling.snapshot import SnapshotParams
from service.store.models import Event, Job
from tests.db_fixtures import Env
from tests.specs import tiny
from workers.admission import lease

BATCH = "/v1/jobs:batch"


def test_a_batch_queues_every_spec_in_order_each_durable_and_dispatchable(env: Env, admin: dict[str, str]) -> None:
    env.client.post("/v1/teams", json={"name": "alpha"}, headers=admin)
    specs = [tiny(name=f"sweep-{i}", team="alpha" if i % 2 else None, priority=i) for i in range(5)]
    r = env.client.post(BATCH, json={"specs": specs}, headers=admin)
    assert r.status_code == 201, r.text
    items = r.json()["items"]
    assert [j["name"] for j in items] == [f"sweep-{i}" for i in range(5)]
    assert [j["team"] for j in items] == ["default", "alpha", "default", "alpha", "default"]
    assert all(j["status"] == "QUEUED" and j["layout"] for j in items)
    ids = [j["id"] for j in items]
    for job_id, spec in zip(ids, specs, strict=True):
        detail = env.client.get(f"/v1/jobs/{job_id}", headers=admin).json()
        assert detail["spec"]["name"] == spec["name"] and detail["plan"]["fits"]
        events = env.client.get(f"/v1/jobs/{job_id}/events", headers=admin).json()
        assert [e["kind"] for e in events] == ["job.queued"]
    with env.app.state.sessions.begin() as session:  # the dispatcher's lease takes them, highest priority first
        leased = lease(session, now=datetime.now(UTC), owner="test", lease_s=60, batch=10,
                       params=SnapshotParams(local_gpus="cpu:2")).ids
    assert leased[:1] == [ids[4]] and set(leased) <= set(ids) and leased


def test_one_refused_item_stores_nothing_and_each_error_names_its_item(env: Env, admin: dict[str, str]) -> None:
    specs = [tiny(name="ok-0"), tiny(name="bad-gpu", resources={"gpu": "H900"}), tiny(name="ok-2"),
             tiny(name="no-fit", model={"preset": "llama-3.1-405b"},
                  resources={"gpu": "H100-SXM-80GB", "gpus_per_node": 8})]
    r = env.client.post(BATCH, json={"specs": specs}, headers=admin)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_spec" and "specs.1" in error["message"]
    assert "nothing was stored" in error["message"]
    assert [(i["index"], i["code"]) for i in error["details"]["items"]] == [(1, "invalid_spec"), (3, "does_not_fit")]
    assert "specs.1.resources.gpu" in {f["loc"] for f in error["fields"]}
    assert env.client.get("/v1/jobs", headers=admin).json()["items"] == []
    with env.app.state.sessions.begin() as session:
        assert session.query(Job).count() == 0 and session.query(Event).count() == 0


def test_schema_errors_name_the_item_index_and_field(env: Env, admin: dict[str, str]) -> None:
    r = env.client.post(BATCH, json={"specs": [tiny(), tiny(training={"global_batch": -1})]}, headers=admin)
    assert r.status_code == 422
    error = r.json()["error"]
    assert error["code"] == "invalid_spec"
    assert [f["loc"] for f in error["fields"]] == ["specs.1.training.global_batch"]


def test_the_size_is_bounded_and_stated(env: Env, admin: dict[str, str]) -> None:
    empty = env.client.post(BATCH, json={"specs": []}, headers=admin)
    assert empty.status_code == 422 and empty.json()["error"]["fields"][0]["loc"] == "specs"
    over = env.client.post(BATCH, json={"specs": [tiny(name=f"x{i}") for i in range(MAX_BATCH + 1)]}, headers=admin)
    assert over.status_code == 422, over.text
    [field] = over.json()["error"]["fields"]
    assert field["loc"] == "specs" and f"at most {MAX_BATCH}" in field["message"]
    assert env.client.get("/v1/jobs", headers=admin).json()["items"] == []


def test_members_submit_only_into_their_team_within_its_priority_limit(env: Env, admin: dict[str, str]) -> None:
    member = env.headers(env.token("member", team="alpha"))
    r = env.client.put("/v1/teams/alpha/quota", json={"max_priority": 10, "flavors": {"cpu": {"nominal": 1}}},
                       headers=admin)
    assert r.status_code == 200, r.text
    other_team = env.client.post(BATCH, json={"specs": [tiny(), tiny(team="beta")]}, headers=member)
    assert other_team.status_code == 403 and other_team.json()["error"]["details"]["items"][0]["index"] == 1
    assert "specs.1.team" in {f["loc"] for f in other_team.json()["error"]["fields"]}
    too_high = env.client.post(BATCH, json={"specs": [tiny(priority=50), tiny()]}, headers=member)
    assert too_high.status_code == 403 and "limit of 10" in too_high.json()["error"]["message"]
    assert "specs.0.priority" in {f["loc"] for f in too_high.json()["error"]["fields"]}
    ok = env.client.post(BATCH, json={"specs": [tiny(), tiny(team="alpha", priority=10)]}, headers=member)
    assert ok.status_code == 201, ok.text
    assert {j["team"] for j in ok.json()["items"]} == {"alpha"}
    beta = env.headers(env.token("member", team="beta"))
    for job in ok.json()["items"]:  # visible to its team only
        assert env.client.get(f"/v1/jobs/{job['id']}", headers=beta).status_code == 404
        assert env.client.get(f"/v1/jobs/{job['id']}", headers=member).status_code == 200


def test_an_unknown_team_is_not_created_and_a_key_is_refused(env: Env, admin: dict[str, str]) -> None:
    r = env.client.post(BATCH, json={"specs": [tiny(team="nosuch")]}, headers=admin)
    assert r.status_code == 404 and r.json()["error"]["fields"][0]["loc"] == "specs.0.team"
    keyed = env.client.post(BATCH, json={"specs": [tiny()]}, headers={**admin, "Idempotency-Key": "k"})
    assert keyed.status_code == 400 and "Idempotency-Key" in keyed.json()["error"]["message"]
    teams = env.client.get("/v1/teams", headers=admin)
    assert teams.status_code == 200 and "nosuch" not in {t["name"] for t in teams.json()}
    assert env.client.get("/v1/jobs", headers=admin).json()["items"] == []


def test_a_batch_needs_a_person_token(env: Env, admin: dict[str, str]) -> None:
    assert env.client.post(BATCH, json={"specs": [tiny()]}).status_code == 401
    job_id = env.client.post("/v1/jobs", json=tiny(), headers=admin).json()["id"]
    job_token = env.headers(env.token("job", job_id=job_id))
    assert env.client.post(BATCH, json={"specs": [tiny()]}, headers=job_token).status_code == 403


def test_a_batch_stops_planning_past_its_budget_and_stores_nothing(env: Env, admin: dict[str, str],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(submission, "BATCH_PLANNING_S", 0.0)  # past the budget once the first item is planned
    r = env.client.post(BATCH, json={"specs": [tiny(name="first"), tiny(name="second", training={"global_batch": 4})]},
                        headers=admin)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "plan_too_costly" and "after 1 of its 2 specs" in error["message"]
    assert "fewer distinct specs" in error["message"]
    assert env.client.get("/v1/jobs", headers=admin).json()["items"] == []


def test_one_submission_stores_every_column_a_batch_item_stores(env: Env, admin: dict[str, str]) -> None:
    """One job takes a statement of its own on PostgreSQL (the job and its event in one), a batch the
    general INSERTs: both must write the same rows."""
    spec = tiny(name="same", priority=2)
    single = env.client.post("/v1/jobs", json=spec, headers=admin)
    batch = env.client.post(BATCH, json={"specs": [spec, tiny(name="other")]}, headers=admin)
    assert single.status_code == 201 and batch.status_code == 201, (single.text, batch.text)
    ids = [single.json()["id"], batch.json()["items"][0]["id"]]
    varying = {"id", "created_at", "updated_at"}  # the ids, and the time each was written

    with env.app.state.sessions.begin() as session:
        jobs = [session.get(Job, job_id) for job_id in ids]
        rows = [{c.key: getattr(job, c.key) for c in Job.__table__.columns if c.key not in varying} for job in jobs]
        events = [[(e.actor, e.kind, e.message, e.data) for e in
                   session.query(Event).filter(Event.job_id == job_id).order_by(Event.id)] for job_id in ids]
        assert all(e.at == job.created_at for job in jobs for e in session.query(Event).filter(Event.job_id == job.id))
    assert rows[0] == rows[1]
    assert rows[0]["spec"].name == "same" and rows[0]["gpus"] >= 1 and rows[0]["predicted_s"] is not None
    assert events[0] == events[1] and [kind for _, kind, _, _ in events[0]] == ["job.queued"]
