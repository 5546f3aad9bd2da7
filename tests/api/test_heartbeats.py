"""Heartbeats (`POST /v1/jobs/{id}/measurements`, kind heartbeat), on SQLite and PostgreSQL: what is stored
and read back, who may report them, and when a job's token stops being able to."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import update

from service.store.models import Job, utcnow
from service.store.tokens import revoke_token
from tests.db_fixtures import Env
from tests.specs import tiny

BEAT = {"kind": "heartbeat", "data": {"step": 20, "loss": 2.25, "tokens_per_s": 4096.5}}


def _job(env: Env, admin: dict[str, str]) -> int:
    r = env.client.post("/v1/jobs", json=tiny(), headers=admin)
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def test_a_heartbeat_is_read_back_as_it_was_answered_and_writes_no_event(env: Env, admin: dict[str, str]) -> None:
    job_id = _job(env, admin)
    token = env.headers(env.token("job", job_id=job_id))
    events_before = env.client.get(f"/v1/jobs/{job_id}/events", headers=admin).json()
    r = env.client.post(f"/v1/jobs/{job_id}/measurements", json=BEAT, headers=token)
    assert r.status_code == 201, r.text
    answered = r.json()
    assert (answered["kind"], answered["data"]) == ("heartbeat", BEAT["data"])
    stored = env.client.get(f"/v1/jobs/{job_id}", headers=admin).json()["measurements"]
    assert stored == {"heartbeat": answered}  # the same time, to the microsecond, and the same data
    assert env.client.get(f"/v1/jobs/{job_id}/events", headers=admin).json() == events_before


def test_an_admin_reports_heartbeats_on_any_job_and_a_missing_job_is_404(env: Env, admin: dict[str, str]) -> None:
    job_id = _job(env, admin)
    assert env.client.post(f"/v1/jobs/{job_id}/measurements", json=BEAT, headers=admin).status_code == 201
    missing = env.client.post(f"/v1/jobs/{job_id + 1000}/measurements", json=BEAT, headers=admin)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    assert env.client.get(f"/v1/jobs/{job_id}", headers=admin).json()["measurements"]["heartbeat"]["data"] == \
        BEAT["data"]


def test_a_member_may_not_report_a_heartbeat_even_on_its_own_teams_job(env: Env) -> None:
    member = env.headers(env.token("member", team="alpha"))
    job_id = _job(env, member)
    r = env.client.post(f"/v1/jobs/{job_id}/measurements", json=BEAT, headers=member)
    assert r.status_code == 403
    assert env.client.get(f"/v1/jobs/{job_id}", headers=member).json()["measurements"] == {}


def test_a_job_token_reports_until_the_grace_after_its_job_ended(env: Env, admin: dict[str, str]) -> None:
    grace = env.app.state.settings.job_token_grace_s
    job_id = _job(env, admin)
    token = env.headers(env.token("job", job_id=job_id))

    def ended(ago_s: float) -> None:
        with env.app.state.sessions.begin() as session:
            session.execute(update(Job).where(Job.id == job_id).values(finished_at=utcnow() - timedelta(seconds=ago_s)))

    ended(grace - 60)
    assert env.client.post(f"/v1/jobs/{job_id}/measurements", json=BEAT, headers=token).status_code == 201
    ended(grace + 1)
    late = env.client.post(f"/v1/jobs/{job_id}/measurements", json=BEAT, headers=token)
    assert late.status_code == 401 and late.json()["error"]["code"] == "unauthorized"


def test_a_revoked_or_expired_job_token_cannot_report(env: Env, admin: dict[str, str]) -> None:
    job_id = _job(env, admin)
    expired = env.headers(env.token("job", job_id=job_id, expires_at=utcnow() - timedelta(seconds=1)))
    assert env.client.post(f"/v1/jobs/{job_id}/measurements", json=BEAT, headers=expired).status_code == 401
    secret = env.token("job", job_id=job_id)
    with env.app.state.sessions.begin() as session:
        revoke_token(session, secret.split("_")[1])
    r = env.client.post(f"/v1/jobs/{job_id}/measurements", json=BEAT, headers=env.headers(secret))
    assert r.status_code == 401
    assert env.client.get(f"/v1/jobs/{job_id}", headers=admin).json()["measurements"] == {}


def test_a_heartbeat_no_database_can_keep_is_a_422_and_stores_nothing(env: Env, admin: dict[str, str]) -> None:
    job_id = _job(env, admin)
    token = env.headers(env.token("job", job_id=job_id))
    for body in (b'{"kind": "heartbeat", "data": {"loss": NaN}}',
                 b'{"kind": "heartbeat", "data": {"note": "a\\u0000b"}}'):
        r = env.client.post(f"/v1/jobs/{job_id}/measurements", content=body,
                            headers={**token, "Content-Type": "application/json"})
        assert r.status_code == 422 and r.json()["error"]["code"] == "validation_error", r.text
    assert env.client.get(f"/v1/jobs/{job_id}", headers=admin).json()["measurements"] == {}
