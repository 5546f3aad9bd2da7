"""Roles on every endpoint: admin, team member, job token, no token, revoked and expired tokens."""

from __future__ import annotations

from datetime import timedelta

import pytest

from service.store.models import utcnow
from tests.db_fixtures import Env
from tests.specs import tiny

ENDPOINTS = [
    ("POST", "/v1/plans"), ("POST", "/v1/jobs"), ("GET", "/v1/jobs"), ("GET", "/v1/jobs/1"),
    ("GET", "/v1/jobs/1/events"), ("POST", "/v1/jobs/1/cancel"), ("POST", "/v1/jobs/1/measurements"),
    ("GET", "/v1/teams"), ("POST", "/v1/teams"), ("POST", "/v1/tokens"), ("GET", "/v1/tokens"),
    ("POST", "/v1/tokens/x/revoke"), ("GET", "/v1/whoami"),
]


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
def test_no_token_is_401_everywhere(env: Env, method: str, path: str) -> None:
    r = env.client.request(method, path, json={})
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    assert r.headers["www-authenticate"] == "Bearer"


def test_a_forged_revoked_or_expired_token_is_401(env: Env) -> None:
    good = env.token("admin")
    forged = good[:-4] + "AAAA"
    assert env.client.get("/v1/whoami", headers=env.headers(forged)).status_code == 401
    expired = env.token("admin", expires_at=utcnow() - timedelta(seconds=1))
    assert env.client.get("/v1/whoami", headers=env.headers(expired)).status_code == 401
    victim = env.token("member", team="alpha")
    token_id = victim.split("_")[1]
    assert env.client.get("/v1/whoami", headers=env.headers(victim)).status_code == 200
    assert env.client.post(f"/v1/tokens/{token_id}/revoke", headers=env.headers(good)).status_code == 200
    assert env.client.get("/v1/whoami", headers=env.headers(victim)).status_code == 401


def test_tokens_minted_through_the_api_work_and_expire(env: Env, admin: dict[str, str]) -> None:
    env.client.post("/v1/teams", json={"name": "alpha"}, headers=admin)
    r = env.client.post("/v1/tokens", json={"team": "alpha", "role": "member"}, headers=admin)
    assert r.status_code == 201
    secret = r.json()["token"]
    who = env.client.get("/v1/whoami", headers=env.headers(secret)).json()
    assert (who["role"], who["team"]) == ("member", "alpha")
    listed = env.client.get("/v1/tokens", headers=admin).json()
    assert all("token" not in t for t in listed) and r.json()["id"] in {t["id"] for t in listed}
    assert env.client.post("/v1/tokens", json={"team": "nope"}, headers=admin).status_code == 404
    assert env.client.post("/v1/tokens", json={"role": "member"}, headers=admin).status_code == 422


@pytest.fixture
def two_teams(env: Env, admin: dict[str, str]) -> dict[str, object]:
    a, b = env.headers(env.token("member", team="alpha")), env.headers(env.token("member", team="beta"))
    job_a = env.client.post("/v1/jobs", json=tiny(), headers=a).json()
    job_b = env.client.post("/v1/jobs", json=tiny(), headers=b).json()
    return {"a": a, "b": b, "job_a": job_a["id"], "job_b": job_b["id"], "team_a": job_a["team"]}


def test_a_member_submits_into_their_own_team(env: Env, two_teams: dict[str, object]) -> None:
    assert two_teams["team_a"] == "alpha"
    r = env.client.post("/v1/jobs", json=tiny(team="beta"), headers=two_teams["a"])  # type: ignore[arg-type]
    assert r.status_code == 403 and "alpha" in r.json()["error"]["message"]


def test_a_member_never_sees_another_teams_job(env: Env, two_teams: dict[str, object]) -> None:
    a, job_b = two_teams["a"], two_teams["job_b"]
    for method, path in (("GET", f"/v1/jobs/{job_b}"), ("GET", f"/v1/jobs/{job_b}/events"),
                         ("POST", f"/v1/jobs/{job_b}/cancel")):
        r = env.client.request(method, path, headers=a)  # type: ignore[arg-type]
        assert r.status_code == 404, (method, path)
        assert r.json()["error"]["message"] == f"no job {job_b}"  # same words as for a job that does not exist
    listed = env.client.get("/v1/jobs", headers=a).json()["items"]  # type: ignore[arg-type]
    assert [j["id"] for j in listed] == [two_teams["job_a"]]
    assert env.client.get("/v1/jobs", params={"team": "beta"}, headers=a).json()["items"] == []  # type: ignore[arg-type]
    assert [t["name"] for t in env.client.get("/v1/teams", headers=a).json()] == ["alpha"]  # type: ignore[arg-type]
    b_status = env.client.get(f"/v1/jobs/{job_b}", headers=two_teams["b"]).json()["status"]  # type: ignore[arg-type]
    assert b_status == "QUEUED"  # the cancel attempt above changed nothing


def test_members_cannot_administer(env: Env, two_teams: dict[str, object]) -> None:
    a = two_teams["a"]
    assert env.client.post("/v1/teams", json={"name": "gamma"}, headers=a).status_code == 403  # type: ignore[arg-type]
    assert env.client.post("/v1/tokens", json={"team": "alpha"}, headers=a).status_code == 403  # type: ignore[arg-type]
    assert env.client.get("/v1/tokens", headers=a).status_code == 403  # type: ignore[arg-type]
    r = env.client.post(f"/v1/jobs/{two_teams['job_a']}/measurements", json={"kind": "report", "data": {}},
                        headers=a)  # type: ignore[arg-type]
    assert r.status_code == 403


def test_a_job_token_reports_only_on_its_own_job(env: Env, two_teams: dict[str, object]) -> None:
    job_a, job_b = two_teams["job_a"], two_teams["job_b"]
    token = env.headers(env.token("job", job_id=job_a))  # type: ignore[arg-type]
    ok = env.client.post(f"/v1/jobs/{job_a}/measurements", json={"kind": "heartbeat", "data": {"step": 1}},
                         headers=token)
    assert ok.status_code == 201
    other = env.client.post(f"/v1/jobs/{job_b}/measurements", json={"kind": "heartbeat", "data": {}},
                            headers=token)
    assert other.status_code == 404
    assert env.client.get(f"/v1/jobs/{job_a}", headers=token).status_code == 200
    assert env.client.get(f"/v1/jobs/{job_b}", headers=token).status_code == 404
    assert [j["id"] for j in env.client.get("/v1/jobs", headers=token).json()["items"]] == [job_a]
    for method, path, body in (("POST", "/v1/jobs", tiny()), ("POST", "/v1/plans", tiny()),
                               ("POST", f"/v1/jobs/{job_a}/cancel", None), ("GET", "/v1/teams", None),
                               ("POST", "/v1/teams", {"name": "x"}), ("POST", "/v1/tokens", {"role": "admin"})):
        assert env.client.request(method, path, json=body, headers=token).status_code == 403, path


def test_admin_sees_every_team(env: Env, admin: dict[str, str], two_teams: dict[str, object]) -> None:
    items = env.client.get("/v1/jobs", headers=admin).json()["items"]
    assert {j["team"] for j in items} == {"alpha", "beta"}
