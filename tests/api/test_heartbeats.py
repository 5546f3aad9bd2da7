"""Heartbeats (`POST /v1/jobs/{id}/measurements`, kind heartbeat), on SQLite and PostgreSQL: what is stored
and read back, who may report them, and when a job's token stops being able to."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from sqlalchemy import update

from service.api.app import SHORTCUT_BODY_BYTES
from service.store.models import Job, utcnow
from service.store.tokens import revoke_token
from tests.connection_counts import counted
from tests.db_fixtures import Env
from tests.log_capture import captured_logs
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


# --- the request gate's shortcut (`service.api.app.SHORTCUTS`, `jobs.heartbeat_shortcut`) -------------

def test_a_heartbeat_is_one_token_lookup_on_one_connection(env: Env, admin: dict[str, str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The token check and the insert share one connection (one thread hop): the gate's own token check
    and the route would take one each. Logged with the job token's id, as the route's request is."""
    job_id = _job(env, admin)
    secret = env.token("job", job_id=job_id)
    with counted(env, monkeypatch) as counts, captured_logs() as logs:
        r = env.client.post(f"/v1/jobs/{job_id}/measurements", json=BEAT, headers=env.headers(secret))
    assert r.status_code == 201, r.text
    assert counts == {"lookups": 1, "checkouts": 1}
    [line] = logs.records("shardctl.access")
    assert (line["route"], line["status"], line["principal"]) == \
        ("/v1/jobs/{job_id}/measurements", 201, secret.split("_", 2)[1])
    assert env.client.get(f"/v1/jobs/{job_id}", headers=admin).json()["measurements"]["heartbeat"] == r.json()


def test_a_heartbeat_the_shortcut_declines_gets_the_routes_answer_with_one_token_lookup(
        env: Env, admin: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A member's token (403) and another job's id (404) are found out after the token was looked up:
    the gate keeps the principal for the route instead of looking it up again. Nothing is stored."""
    mine, other = _job(env, admin), _job(env, admin)
    job = env.headers(env.token("job", job_id=mine))
    member = env.headers(env.token("member", team="alpha"))
    for headers, job_id, status in ((member, mine, 403), (job, other, 404)):
        with counted(env, monkeypatch) as counts:
            r = env.client.post(f"/v1/jobs/{job_id}/measurements", json=BEAT, headers=headers)
        assert r.status_code == status, r.text
        assert counts["lookups"] == 1
    for job_id in (mine, other):
        assert env.client.get(f"/v1/jobs/{job_id}", headers=admin).json()["measurements"] == {}


def test_the_token_is_answered_before_the_body_with_or_without_the_shortcut(env: Env, admin: dict[str, str]) -> None:
    """A bad token is a 401 whatever the body holds, as for any route: a body the shortcut cannot read
    (malformed, or not a heartbeat) goes to the gate's checks, which look at the token first."""
    job_id = _job(env, admin)
    bogus = {"Authorization": "Bearer shc_0123456789abcdef_not-a-real-secret", "Content-Type": "application/json"}
    for body in (json.dumps(BEAT).encode(), b'{"kind": "heartbeat", "data": ', b'{"kind": "report", "data": {}}',
                 b'{"kind": "heartbeat", "data": {"loss": NaN}}'):
        r = env.client.post(f"/v1/jobs/{job_id}/measurements", content=body, headers=bogus)
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized", (body, r.text)
        assert r.headers["WWW-Authenticate"] == "Bearer"
    token = env.headers(env.token("job", job_id=job_id))
    r = env.client.post(f"/v1/jobs/{job_id}/measurements", content=b'{"kind": "heartbeat", "data": ',
                        headers={**token, "Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_request"
    r = env.client.post(f"/v1/jobs/{job_id}/measurements", json={"kind": "heartbeat", "data": [1, 2]}, headers=token)
    assert r.status_code == 422 and r.json()["error"]["fields"][0]["loc"] == "data", r.text
    for path in ("/v1/jobs/0/measurements", "/v1/jobs/x/measurements", f"/v1/jobs/{2**63}/measurements"):
        r = env.client.post(path, json=BEAT, headers=token)  # ids the shortcut leaves to the route's `JobId`
        assert r.status_code == 422 and r.json()["error"]["fields"][0]["loc"] == "path.job_id", (path, r.text)
    assert env.client.get(f"/v1/jobs/{job_id}", headers=admin).json()["measurements"] == {}
    r = env.client.post(f"/v1/jobs/0{job_id}/measurements", json=BEAT, headers=token)
    assert r.status_code == 201, r.text  # the route reads a leading zero as `JobId` always did


def test_a_heartbeat_too_large_for_the_shortcut_or_sent_chunked_is_stored_by_the_route_alike(
        env: Env, admin: dict[str, str]) -> None:
    """Over `SHORTCUT_BODY_BYTES`, or without a Content-Length, the route stores the heartbeat: the
    answer has the same shape, headers and media type as the shortcut's."""
    job_id = _job(env, admin)
    token = env.headers(env.token("job", job_id=job_id))
    small = env.client.post(f"/v1/jobs/{job_id}/measurements", json=BEAT, headers=token)
    large_beat = {"kind": "heartbeat", "data": {**BEAT["data"], "note": "x" * SHORTCUT_BODY_BYTES}}
    large = env.client.post(f"/v1/jobs/{job_id}/measurements", json=large_beat, headers=token)
    chunked = env.client.post(f"/v1/jobs/{job_id}/measurements", content=iter([json.dumps(BEAT).encode()]),
                              headers={**token, "Content-Type": "application/json"})
    assert "content-length" not in chunked.request.headers
    for r, sent in ((small, BEAT), (large, large_beat), (chunked, BEAT)):
        assert r.status_code == 201, r.text
        assert set(r.json()) == {"kind", "at", "data"} and r.json()["data"] == sent["data"]
        assert {k for k in r.headers if k != "content-length"} == {k for k in small.headers if k != "content-length"}
        assert r.headers["content-type"] == "application/json"
    stored = env.client.get(f"/v1/jobs/{job_id}", headers=admin).json()["measurements"]["heartbeat"]
    assert stored["at"] >= large.json()["at"]


def test_a_measurement_the_server_cannot_read_is_a_422_and_the_job_page_stays_up(env: Env,
                                                                                 admin: dict[str, str]) -> None:
    """A heartbeat's `step` must be an integer (or null), a report's figures numbers: anything else is a
    422 naming the field, stored nowhere. The dashboard's job page keeps answering with what is stored,
    and with rows stored before measurements were checked."""
    from service.store.models import Measurement
    from service.store.vocab import MeasurementKind

    job_id = _job(env, admin)
    url = f"/v1/jobs/{job_id}/measurements"
    for data, field in (({"step": "x"}, "data.step"), ({"step": 1.5}, "data.step"), ({"loss": "low"}, "data.loss"),
                        ({"step": True}, "data.step")):
        r = env.client.post(url, json={"kind": "heartbeat", "data": data}, headers=admin)
        assert r.status_code == 422 and field in r.text, (data, r.text)
    bad_report = {"kind": "report", "data": {"status": "succeeded", "measured": {"step_s": "fast"}}}
    r = env.client.post(url, json=bad_report, headers=admin)
    assert r.status_code == 422 and "data.measured.step_s" in r.text, r.text
    assert env.client.get(f"/v1/jobs/{job_id}", headers=admin).json()["measurements"] == {}
    for step in (None, 2, 3):
        r = env.client.post(url, json={"kind": "heartbeat", "data": {"step": step, "loss": 1.0}}, headers=admin)
        assert r.status_code == 201, r.text
    with env.app.state.sessions.begin() as session:  # as stored by an older server
        session.add(Measurement(job_id=job_id, kind=MeasurementKind.HEARTBEAT, data={"step": "x", "loss": "y"}))
        session.add(Measurement(job_id=job_id, kind=MeasurementKind.REPORT,
                                data={"status": "failed", "start_step": "z", "losses": "nan"}))
    env.sign_in_ui(admin["Authorization"].split()[1])
    page = env.client.get(f"/ui/jobs/{job_id}")
    assert page.status_code == 200, page.text[:500]
