"""Edges of the API: racing first submissions, timestamps with their
UTC offset on both databases, and an OpenAPI document that lists every status and media type.

Each failed on the code before: 16 first submissions at once on PostgreSQL were 500s (two requests
created the default team), SQLite timestamps had no offset, the document had no 400/401/403/413/415
nor text/event-stream, and a 405 named one of the path's methods.
"""

from __future__ import annotations

import re
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from service.store.models import Event, Job, Team
from service.store.tokens import ensure_team
from tests.db_fixtures import Env
from tests.specs import tiny


def test_sixteen_first_submissions_at_once_all_succeed(env: Env, live: str) -> None:
    """No team exists yet: every submission without a team creates the implicit default team, at once."""
    admin = env.headers(env.token("admin"))  # an admin token has no team
    with httpx.Client(base_url=live, timeout=60) as client:  # plan once, so the race is in the store only
        assert client.post("/v1/plans", json=tiny(), headers=admin).status_code == 200
    start = threading.Barrier(16)

    def post(i: int) -> int:
        with httpx.Client(base_url=live, timeout=60) as client:
            start.wait()
            return client.post("/v1/jobs", json=tiny(name=f"first-{i}"), headers=admin).status_code

    with ThreadPoolExecutor(max_workers=16) as pool:
        statuses = list(pool.map(post, range(16)))
    assert statuses == [201] * 16
    with env.app.state.sessions.begin() as session:
        assert session.scalars(select(Team.name)).all() == ["default"]
        assert session.scalar(select(func.count()).select_from(Job)) == 16


def test_a_unique_violation_a_concurrent_request_caused_is_a_409(env: Env, admin: dict[str, str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A check-then-insert that loses a race (two POST /v1/teams of one name at once) is a 409
    `conflict` saying to retry, not a 500."""
    from service.api.routers import teams

    def lost_the_race(session: object, name: str) -> None:
        raise IntegrityError("INSERT INTO teams ...", {}, Exception("duplicate key value violates uq_teams_name"))

    monkeypatch.setattr(teams, "create_team", lost_the_race)
    r = env.client.post("/v1/teams", json={"name": "alpha"}, headers=admin)
    assert r.status_code == 409 and r.json()["error"]["code"] == "conflict", r.text


def test_ensure_team_returns_the_team_an_earlier_transaction_created(env: Env) -> None:
    """The read path; the insert race itself is `test_sixteen_first_submissions_at_once_all_succeed`."""
    sessions = env.app.state.sessions
    with sessions.begin() as session:
        first = ensure_team(session, "alpha")
    with sessions.begin() as session:
        assert ensure_team(session, "alpha").id == first.id
        assert session.scalar(select(func.count()).select_from(Team)) == 1


def _offset(text: str) -> str:
    return "+00:00" if text.endswith("Z") else text[-6:]


def test_timestamps_carry_their_utc_offset_on_both_databases(env: Env, admin: dict[str, str]) -> None:
    job = env.client.post("/v1/jobs", json=tiny(), headers=admin).json()
    stamps = [job["created_at"], job["updated_at"]]
    stamps += [e["at"] for e in env.client.get(f"/v1/jobs/{job['id']}/events", headers=admin).json()]
    stamps += [t["created_at"] for t in env.client.get("/v1/tokens", headers=admin).json()]
    stamps += [env.client.post(f"/v1/jobs/{job['id']}/cancel", headers=admin).json()["finished_at"]]
    for stamp in stamps:
        assert _offset(stamp) == "+00:00", stamp
        assert datetime.fromisoformat(stamp).utcoffset() is not None
    with env.app.state.sessions.begin() as session:
        stored = session.scalars(select(Event.at)).all() + session.scalars(select(Job.created_at)).all()
    assert stored and all(at.tzinfo is UTC for at in stored)


def test_a_time_written_in_another_zone_reads_back_as_the_same_instant_in_utc(env: Env) -> None:
    from datetime import timedelta, timezone

    local = datetime(2026, 3, 1, 12, 0, tzinfo=timezone(timedelta(hours=5, minutes=30)))
    sessions = env.app.state.sessions
    with sessions.begin() as session:
        team = ensure_team(session, "alpha")
        team.created_at = local
    with sessions.begin() as session:
        read = session.scalars(select(Team.created_at)).one()
    assert read == local and read.tzinfo is UTC and read.hour == 6 and read.minute == 30
    with sessions.begin() as session:  # and a comparison with an aware bound finds it
        assert session.scalar(select(func.count()).select_from(Team).where(Team.created_at >= local)) == 1


def test_openapi_lists_every_status_and_media_type(env: Env) -> None:
    document = env.client.get("/openapi.json").json()
    paths = document["paths"]

    def statuses(path: str, method: str) -> set[str]:
        return set(paths[path][method]["responses"])

    assert {"201", "200", "400", "401", "403", "404", "409", "413", "415", "422", "503"} <= statuses("/v1/jobs", "post")
    assert {"200", "401", "422"} <= statuses("/v1/jobs", "get") and "415" not in statuses("/v1/jobs", "get")
    assert {"200", "400", "401", "404", "422", "429"} <= statuses("/v1/jobs/{job_id}/events", "get")
    assert {"202", "401", "403", "413", "415"} <= statuses("/v1/jobs/{job_id}/profiles/traces", "post")
    assert {"401", "403", "413", "415"} <= statuses("/v1/tokens", "post")
    assert "503" in statuses("/readyz", "get")
    events = paths["/v1/jobs/{job_id}/events"]["get"]["responses"]["200"]["content"]
    assert {"application/json", "text/event-stream"} <= set(events)
    assert any(m.startswith("text/plain") for m in paths["/metrics"]["get"]["responses"]["200"]["content"])
    for path, operations in paths.items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                if status.startswith(("4", "5")):
                    schema = response["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/ErrorResponse"}, (path, method, status)
    assert "HTTPValidationError" not in document["components"]["schemas"]


def test_a_405_names_every_method_of_the_path(env: Env, admin: dict[str, str]) -> None:
    paths = env.client.get("/openapi.json").json()["paths"]
    for template, operations in paths.items():
        path = re.sub(r"\{[^}]+\}", "1", template)
        allowed = ", ".join(sorted(m.upper() for m in operations))
        for method in {"GET", "POST", "PUT", "PATCH", "DELETE"} - {m.upper() for m in operations}:
            r = env.client.request(method, path, headers=admin)
            assert r.status_code == 405, (method, path, r.text)
            assert r.headers["allow"] == allowed, (method, path, r.headers["allow"])
            assert r.json()["error"]["code"] == "method_not_allowed"
    assert env.client.request("PATCH", "/v1/jobs", headers=admin).headers["allow"] == "GET, POST"


def test_postgresql_sessions_read_times_in_utc_whatever_the_servers_zone(postgres_url: str) -> None:
    """`make_engine` puts each PostgreSQL session in UTC, so psycopg reads every timestamptz with
    `datetime.UTC` itself (which `as_utc` passes through), not a ZoneInfo of the server's zone. Here
    the connection starts in Asia/Kolkata (a startup option, as a server's default zone would be)."""
    from sqlalchemy import text
    from sqlalchemy.engine import make_url

    from service.store.db import make_engine

    url = make_url(postgres_url).update_query_dict({"options": "-c TimeZone=Asia/Kolkata"})
    engine = make_engine(url.render_as_string(hide_password=False))
    try:
        at = text("SELECT TIMESTAMPTZ '2026-03-01 12:00:00+05:30'")
        for _ in range(2):  # the second time on the same pooled connection, after its rollback
            with engine.connect() as conn:
                read = conn.execute(at).scalar_one()
                assert read.tzinfo is UTC and (read.hour, read.minute) == (6, 30)
                assert conn.execute(text("SHOW TIME ZONE")).scalar_one() == "UTC"
        with engine.connect() as a, engine.connect() as b:  # and on a second connection of the pool
            assert a.execute(at).scalar_one().tzinfo is UTC and b.execute(at).scalar_one().tzinfo is UTC
    finally:
        engine.dispose()
