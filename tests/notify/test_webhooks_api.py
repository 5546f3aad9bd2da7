"""The webhooks API on both databases: what a subscription may point at, which events it may name,
who sees and manages which, and the secret shown once."""

from __future__ import annotations

import pytest

from tests.db_fixtures import Env


def _post(env: Env, headers: dict[str, str], **body: object):  # type: ignore[no-untyped-def]
    return env.client.post("/v1/webhooks", json={"url": "https://93.184.216.34/hook", "events": ["job.failed"],
                                                 **body}, headers=headers)


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080/hook", "http://localhost/hook", "http://[::1]/hook",
                                 "http://10.1.2.3/hook", "http://192.168.0.10/hook", "http://169.254.169.254/latest",
                                 "http://[::ffff:127.0.0.1]/hook", "http://0.0.0.0/hook",
                                 # IPv6 addresses that carry a private IPv4 one: 6to4, NAT64, Teredo
                                 "http://[2002:7f00:1::1]/hook", "http://[2002:a9fe:a9fe::1]/latest",
                                 "http://[64:ff9b::a9fe:a9fe]/latest", "http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/",
                                 "http://192.0.0.8/hook"])
def test_a_private_address_is_refused_by_default(env: Env, admin: dict[str, str], url: str) -> None:
    r = _post(env, admin, url=url)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["fields"][0]["loc"] == "url"
    assert "SHARDCTL_WEBHOOK_ALLOW_PRIVATE=1" in error["message"]  # the fix, named


def test_an_operator_may_allow_private_addresses(env: Env, admin: dict[str, str]) -> None:
    env.app.state.settings.webhook_allow_private = True
    assert _post(env, admin, url="http://127.0.0.1:8080/hook").status_code == 201


@pytest.mark.parametrize(("url", "words"), [("ftp://93.184.216.34/x", "http:// or https://"),
                                            ("https://user:pw@93.184.216.34/x", "credentials"),
                                            ("https:///nohost", "no host"),
                                            ("http://93.184.216.34:0/x", "port 0"),
                                            ("https://name.invalid/hook", "does not resolve")])
def test_other_bad_urls_say_why(env: Env, admin: dict[str, str], url: str, words: str) -> None:
    r = _post(env, admin, url=url)
    assert r.status_code == 422 and words in r.json()["error"]["message"], r.text


def test_a_public_address_is_accepted_and_the_secret_is_shown_once(env: Env, admin: dict[str, str]) -> None:
    r = _post(env, admin, events=["job.succeeded", "job.failed"], description="ci")
    assert r.status_code == 201, r.text
    created = r.json()
    assert created["id"].startswith("wh_") and created["secret"].startswith("whsec_") and created["team"] is None
    shown = env.client.get(f"/v1/webhooks/{created['id']}", headers=admin).json()
    assert "secret" not in shown and shown["events"] == ["job.succeeded", "job.failed"]
    assert [h["id"] for h in env.client.get("/v1/webhooks", headers=admin).json()] == [created["id"]]


def test_unknown_event_types_are_refused_with_the_valid_ones(env: Env, admin: dict[str, str]) -> None:
    r = _post(env, admin, events=["job.succeeded", "job.exploded"])
    assert r.status_code == 422
    error = r.json()["error"]
    assert error["fields"][0]["loc"] == "events" and "'job.exploded'" in error["message"]
    assert "job.succeeded" in error["message"] and "job.failed" in error["message"] and '"*"' in error["message"]
    assert _post(env, admin, events=["*"]).status_code == 201


def test_members_manage_their_teams_subscriptions_only(env: Env, admin: dict[str, str]) -> None:
    alpha = env.headers(env.token("member", team="alpha"))
    beta = env.headers(env.token("member", team="beta"))
    mine = _post(env, alpha).json()
    assert mine["team"] == "alpha"
    refused = _post(env, alpha, team="beta")  # a member cannot subscribe for another team
    assert refused.status_code == 403 and refused.json()["error"]["fields"][0]["loc"] == "team"
    everyone = _post(env, admin).json()  # an admin's, for every team
    assert [h["id"] for h in env.client.get("/v1/webhooks", headers=alpha).json()] == [mine["id"]]
    assert env.client.get("/v1/webhooks", headers=beta).json() == []
    for path in (f"/v1/webhooks/{mine['id']}", f"/v1/webhooks/{everyone['id']}"):
        assert env.client.get(path, headers=beta).status_code == 404
    assert env.client.post(f"/v1/webhooks/{mine['id']}/rotate", headers=beta).status_code == 404
    assert env.client.delete(f"/v1/webhooks/{mine['id']}", headers=beta).status_code == 404
    assert env.client.delete(f"/v1/webhooks/{mine['id']}", headers=alpha).status_code == 204
    assert env.client.get(f"/v1/webhooks/{mine['id']}", headers=alpha).status_code == 404
    assert {h["id"] for h in env.client.get("/v1/webhooks", headers=admin).json()} == {everyone["id"]}


def test_an_admin_names_a_team_that_exists(env: Env, admin: dict[str, str]) -> None:
    r = _post(env, admin, team="nobody")
    assert r.status_code == 422 and r.json()["error"]["fields"][0]["loc"] == "team"
    env.token("member", team="gamma")
    assert _post(env, admin, team="gamma").json()["team"] == "gamma"


def test_a_job_token_cannot_subscribe(env: Env, admin: dict[str, str]) -> None:
    job_id = env.client.post("/v1/jobs", json={"name": "j", "model": {"preset": "llama-tiny"},
                                               "training": {"global_batch": 8, "precision": "fp32", "steps": 1},
                                               "resources": {"gpu": "cpu", "gpus_per_node": 2, "nodes": 1}},
                             headers=admin).json()["id"]
    job = env.headers(env.token("job", job_id=job_id))
    assert _post(env, job).status_code == 403
    assert env.client.get("/v1/webhooks", headers=job).status_code == 403
