"""Forwarded identity from an authenticating proxy (oauth2-proxy): honoured only when it is switched on and
the request comes from a trusted proxy address; ignored entirely otherwise; a shardctl token still works."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.api.app import create_app
from service.settings import Settings
from service.store.db import make_engine
from service.store.tokens import create_token, ensure_team
from tests.db_fixtures import LiveServer
from tests.specs import tiny

ON = {"forwarded_auth": True, "forwarded_trusted_proxies": ["127.0.0.1/32"], "forwarded_admin_groups": ["ops"],
      "forwarded_team_groups": {"ml-vision": "vision", "ml-speech": "speech"}}
Serve = Callable[..., AbstractContextManager[tuple[str, Any]]]


@pytest.fixture
def serve(db_url: str, tmp_path: Path) -> Serve:
    """A live API (uvicorn on 127.0.0.1: the test is the proxy) with the given settings, on each database."""

    @contextmanager
    def run(**settings: Any) -> Iterator[tuple[str, Any]]:
        engine = make_engine(db_url)
        app = create_app(Settings(database_url=db_url, data_dir=tmp_path, **settings), engine=engine)
        try:
            with LiveServer(app) as base:
                yield base, app
        finally:
            engine.dispose()

    return run


def as_user(user: str, groups: str, **extra: str) -> dict[str, str]:
    """What the proxy forwards for `user`, from a tool of this site (`X-Requested-With`)."""
    return {"X-Forwarded-User": user, "X-Forwarded-Groups": groups, "X-Requested-With": "shardctl", **extra}


def test_off_by_default_the_headers_are_ignored(serve: Serve) -> None:
    with serve() as (base, _):
        answer = httpx.get(f"{base}/v1/whoami", headers=as_user("alice", "ops"))
        assert answer.status_code == 401 and "bearer token" in answer.json()["error"]["message"]
        body = httpx.post(f"{base}/v1/jobs", json=tiny(), headers=as_user("alice", "ops"))
        assert body.status_code == 401  # the request gate ignores them too


def test_groups_map_to_admin_and_to_a_team_from_a_trusted_proxy(serve: Serve) -> None:
    with serve(**ON) as (base, _):
        admin = httpx.get(f"{base}/v1/whoami", headers=as_user("alice", "staff, ops")).json()
        assert admin["role"] == "admin" and admin["token_id"] == "user:alice"
        member = httpx.get(f"{base}/v1/whoami", headers=as_user("bob", "ml-vision")).json()
        assert member["role"] == "member" and member["team"] == "vision"
        # A route with a body passes the request gate as the forwarded user; the job is the team's.
        job = httpx.post(f"{base}/v1/jobs", json=tiny(), headers=as_user("bob", "ml-vision"))
        assert job.status_code == 201 and job.json()["team"] == "vision"
        events = httpx.get(f"{base}/v1/jobs/{job.json()['id']}/events", headers=as_user("bob", "ml-vision")).json()
        assert events[0]["actor"] == "member:user:bob"
        # Another team's member does not see it.
        other = httpx.get(f"{base}/v1/jobs/{job.json()['id']}", headers=as_user("carol", "ml-speech"))
        assert other.status_code == 404


def test_a_user_in_no_mapped_group_or_several_teams(serve: Serve) -> None:
    with serve(**ON) as (base, _):
        nobody = httpx.get(f"{base}/v1/whoami", headers=as_user("dave", "staff"))
        assert nobody.status_code == 403 and "SHARDCTL_FORWARDED_TEAM_GROUPS" in nobody.json()["error"]["message"]
        both = as_user("erin", "ml-vision,ml-speech")
        several = httpx.get(f"{base}/v1/whoami", headers=both)
        assert several.status_code == 403 and "X-Shardctl-Team" in several.json()["error"]["message"]
        chosen = httpx.get(f"{base}/v1/whoami", headers={**both, "X-Shardctl-Team": "speech"}).json()
        assert chosen["team"] == "speech"
        refused = httpx.get(f"{base}/v1/whoami", headers={**both, "X-Shardctl-Team": "ops"})
        assert refused.status_code == 403
        bad = httpx.get(f"{base}/v1/whoami", headers=as_user("a b", "ops"))
        assert bad.status_code == 400


def test_an_identity_header_sent_twice_is_refused(serve: Serve) -> None:
    """A proxy that adds its header beside the client's own: which one it meant cannot be told, so neither
    is used (the first used to win, and it may be the client's)."""
    with serve(**ON) as (base, _):
        twice = [("X-Forwarded-User", "mallory"), ("X-Forwarded-User", "bob"), ("X-Forwarded-Groups", "ml-vision"),
                 ("X-Requested-With", "shardctl")]
        for path in ("/v1/whoami", "/v1/jobs"):
            r = httpx.get(f"{base}{path}", headers=twice)
            assert r.status_code == 400 and "came 2 times" in r.json()["error"]["message"], r.text
        r = httpx.post(f"{base}/v1/jobs", json=tiny(), headers=twice)
        assert r.status_code == 400, r.text
        groups = [("X-Forwarded-User", "bob"), ("X-Forwarded-Groups", "ops"), ("X-Forwarded-Groups", "ml-vision"),
                  ("X-Requested-With", "shardctl")]
        assert httpx.get(f"{base}/v1/whoami", headers=groups).status_code == 400


def test_from_an_address_that_is_not_a_trusted_proxy_the_headers_are_ignored(serve: Serve) -> None:
    with serve(**{**ON, "forwarded_trusted_proxies": ["10.0.0.0/8"]}) as (base, _):
        answer = httpx.get(f"{base}/v1/whoami", headers=as_user("alice", "ops"))
        assert answer.status_code == 401
        assert httpx.post(f"{base}/v1/teams", json={"name": "x"}, headers=as_user("alice", "ops")).status_code == 401


def test_a_bearer_token_still_works_and_wins_over_the_headers(serve: Serve) -> None:
    with serve(**ON) as (base, app):
        with app.state.sessions.begin() as session:
            _, secret = create_token(session, role="member", team=ensure_team(session, "speech"))  # type: ignore[arg-type]
        token = {"Authorization": f"Bearer {secret}"}
        who = httpx.get(f"{base}/v1/whoami", headers={**as_user("alice", "ops"), **token}).json()
        assert who["role"] == "member" and who["team"] == "speech"
        revoked = httpx.get(f"{base}/v1/whoami", headers={**as_user("alice", "ops"),
                                                          "Authorization": "Bearer shc_nope_nope"})
        assert revoked.status_code == 401  # a shardctl token that does not work is not rescued by the headers
        # A proxy that passes its own ID token on (not a shardctl token) leaves the forwarded identity in charge.
        passed = httpx.get(f"{base}/v1/whoami", headers={**as_user("alice", "ops"),
                                                         "Authorization": "Bearer eyJhbGciOiJSUzI1NiJ9.e30.x"})
        assert passed.json()["token_id"] == "user:alice"


def test_header_names_are_configurable(serve: Serve) -> None:
    custom = {**ON, "forwarded_user_header": "X-Auth-Request-User", "forwarded_groups_header": "X-Auth-Request-Groups"}
    with serve(**custom) as (base, _):
        who = httpx.get(f"{base}/v1/whoami", headers={"X-Auth-Request-User": "alice", "X-Auth-Request-Groups": "ops"})
        assert who.json()["role"] == "admin"
        assert httpx.get(f"{base}/v1/whoami", headers=as_user("alice", "ops")).status_code == 401


def test_live_streams_follow_a_forwarded_user_with_its_visibility(serve: Serve) -> None:
    """The feed and a job's event stream work for a forwarded user as for a token: a member's feed holds
    its team's events only, and another team's job stream is a 404."""
    with serve(**ON) as (base, _):
        vision = httpx.post(f"{base}/v1/jobs", json=tiny(name="v", team="vision"), headers=as_user("bob", "ml-vision"))
        speech = httpx.post(f"{base}/v1/jobs", json=tiny(name="s", team="speech"), headers=as_user("eve", "ml-speech"))
        assert vision.status_code == speech.status_code == 201, (vision.text, speech.text)
        mine, theirs = vision.json()["id"], speech.json()["id"]
        with httpx.stream("GET", f"{base}/v1/events", params={"stream": "true"},
                          headers=as_user("bob", "ml-vision"), timeout=30) as feed:
            assert feed.status_code == 200
            first = next(line for line in feed.iter_lines() if line.startswith("data: "))
            assert json.loads(first.removeprefix("data: "))["job_id"] == mine
        with httpx.stream("GET", f"{base}/v1/jobs/{mine}/events", params={"stream": "true"},
                          headers=as_user("bob", "ml-vision"), timeout=30) as events:
            assert events.status_code == 200
            assert any(line.startswith("event: job.queued") for line in events.iter_lines())
        other = httpx.get(f"{base}/v1/jobs/{theirs}/events", params={"stream": "true"},
                          headers=as_user("bob", "ml-vision"))
        assert other.status_code == 404


def test_another_sites_form_cannot_act_as_a_forwarded_user(serve: Serve) -> None:
    """The proxy's sign-in is a browser cookie, sent with another site's forms too: a request that changes
    something must show it came from this site (X-Requested-With, or the browser's Sec-Fetch-Site)."""
    with serve(**ON) as (base, _):
        job = httpx.post(f"{base}/v1/jobs", json=tiny(name="v", team="vision"), headers=as_user("bob", "ml-vision"))
        assert job.status_code == 201, job.text
        job_id = job.json()["id"]
        forged = {"X-Forwarded-User": "bob", "X-Forwarded-Groups": "ml-vision", "Sec-Fetch-Site": "cross-site",
                  "Content-Type": "application/x-www-form-urlencoded"}
        refused = httpx.post(f"{base}/v1/jobs/{job_id}/cancel", headers=forged)
        assert refused.status_code == 403 and "X-Requested-With" in refused.json()["error"]["message"]
        assert httpx.get(f"{base}/v1/jobs/{job_id}", headers=forged).json()["status"] == "QUEUED"  # reads are fine
        browser = {**forged, "Sec-Fetch-Site": "same-origin"}  # this site's own page
        assert httpx.post(f"{base}/v1/jobs/{job_id}/cancel", headers=browser).status_code == 200
