"""A token the API has authenticated before is checked inside the request's own statement (a read of a
job or a list page, a heartbeat's insert, a submission's read of its team: `service.store.known_tokens`):
it must stop working exactly when `tokens.authenticate` says so, on SQLite and PostgreSQL, whatever the
statement finds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, literal, select, update

from service.store import tokens
from service.store.db import one_statement
from service.store.known_tokens import TOKEN_LIVE, KnownTokens, live_values
from service.store.models import ApiToken, Job
from service.store.tokens import Principal, authenticate
from service.store.vocab import Role
from tests.db_fixtures import Env
from tests.specs import tiny
from tests.statement_log import statements


def _job(env: Env, headers: dict[str, str]) -> int:
    r = env.client.post("/v1/jobs", json=tiny(), headers=headers)
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def _reads(env: Env, headers: dict[str, str], job_id: int) -> tuple[int, int, int]:
    """Status of the job's read, of a list page with rows, and of an empty list page."""
    return tuple(env.client.get(path, headers=headers).status_code  # type: ignore[return-value]
                 for path in _paths(job_id))


def _paths(job_id: int) -> tuple[str, str, str]:
    return f"/v1/jobs/{job_id}", "/v1/jobs?limit=1", "/v1/jobs?status=SUCCEEDED"


def _set(env: Env, table: type[ApiToken] | type[Job], row_id: object, **values: object) -> None:
    with env.app.state.sessions.begin() as session:
        session.execute(update(table).where(table.id == row_id).values(**values))


def test_a_remembered_token_stops_working_at_once_when_revoked_or_expired(env: Env, admin: dict[str, str]) -> None:
    """For each read (the job, a page with rows, an empty page), a token proven remembered by that read
    (answered without its lookup), then revoked (through the API) or expired (in the store): that same
    read is now a 401, and the token is forgotten."""
    job_id = _job(env, admin)
    for path in _paths(job_id):
        for end in ("revoke", "expire"):
            secret = env.token("member", team="default")
            headers = env.headers(secret)
            assert env.client.get(path, headers=headers).status_code == 200
            with statements(env) as seen:
                assert env.client.get(path, headers=headers).status_code == 200
            # an empty page proves nothing of the token: it is looked up
            assert ("SELECT api_tokens" in seen) == path.endswith("SUCCEEDED"), (path, seen)
            token_id = secret.split("_")[1]
            if end == "revoke":
                assert env.client.post(f"/v1/tokens/{token_id}/revoke", headers=admin).status_code == 200
            else:
                _set(env, ApiToken, token_id, expires_at=datetime.now(UTC) - timedelta(seconds=1))
            assert env.client.get(path, headers=headers).status_code == 401, (path, end)
            assert env.app.state.known_tokens.principal(secret) is None


def test_a_remembered_job_token_ends_with_the_grace_after_its_job(env: Env, admin: dict[str, str]) -> None:
    """A job token reads its own job (and lists it) while the job runs and for `job_token_grace_s` after
    it ends, then gets a 401 at once, as a token looked up afresh would; another job is a 404 all along."""
    grace = env.app.state.settings.job_token_grace_s
    for listed in (False, True):
        job_id, other = _job(env, admin), _job(env, admin)
        job = env.headers(env.token("job", job_id=job_id))
        read = "/v1/jobs?limit=1" if listed else f"/v1/jobs/{job_id}"
        assert env.client.get(read, headers=job).status_code == 200
        assert env.client.get(f"/v1/jobs/{other}", headers=job).status_code == 404
        now = datetime.now(UTC)
        _set(env, Job, job_id, finished_at=now - timedelta(seconds=grace - 60))
        with statements(env) as seen:
            assert env.client.get(read, headers=job).status_code == 200
        assert "SELECT api_tokens" not in seen
        assert env.client.get(f"/v1/jobs/{other}", headers=job).status_code == 404
        _set(env, Job, job_id, finished_at=now - timedelta(seconds=grace + 1))
        assert env.client.get(read, headers=job).status_code == 401, read


def _jobs_stored(env: Env) -> int:
    with env.app.state.sessions() as session:
        return int(session.scalar(select(func.count()).select_from(Job)) or 0)


def test_a_remembered_submitter_is_checked_by_the_teams_read_and_refused_at_once(env: Env) -> None:
    """A submission from a token seen before checks it in the transaction's read of the team: once
    the token is revoked, its next submission is a 401 and stores nothing, even one the planner would
    refuse (a 401 before the 422, as for a token looked up first)."""
    admin = env.headers(env.token("admin"))
    secret = env.token("member", team="alpha")
    member = env.headers(secret)
    assert env.client.post("/v1/jobs", json=tiny(name="first"), headers=member).status_code == 201
    with statements(env) as seen:
        assert env.client.post("/v1/jobs", json=tiny(name="second"), headers=member).status_code == 201
    assert seen[0] == "SELECT teams" and "SELECT api_tokens" not in seen
    unfit = tiny(model={"preset": "llama-3.1-405b"}, resources={"gpu": "H100-SXM-80GB", "gpus_per_node": 8})
    refused = env.client.post("/v1/jobs", json=unfit, headers=member)
    assert refused.status_code == 422, refused.text  # from a remembered token: the route's own answer
    stored = _jobs_stored(env)
    assert env.client.post(f"/v1/tokens/{secret.split('_')[1]}/revoke", headers=admin).status_code == 200
    for spec in (unfit, tiny(name="third")):  # the unfit one first, while the token is still remembered
        r = env.client.post("/v1/jobs", json=spec, headers=member)
        assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer", r.text
    assert _jobs_stored(env) == stored


def test_a_remembered_submitter_into_a_team_not_made_yet_is_looked_up_then_submits(env: Env) -> None:
    """The default team is made by the first submission into it. A token remembered from a read, whose
    submission finds no team, proves nothing: it is looked up and the submission goes on as before."""
    admin = env.headers(env.token("admin"))
    assert env.client.get("/v1/jobs/1", headers=admin).status_code == 404  # remembered; no team yet
    with statements(env) as seen:
        r = env.client.post("/v1/jobs", json=tiny(), headers=admin)
    assert r.status_code == 201 and r.json()["team"] == "default", r.text
    token_and_team = [s for s in seen if s in ("SELECT api_tokens", "SELECT teams")]  # planning reads too
    assert token_and_team[:3] == ["SELECT teams", "SELECT api_tokens", "SELECT teams"], seen


def test_a_remembered_heartbeat_is_one_insert_and_a_dead_token_is_refused_before_anything_else(env: Env) -> None:
    """A job token's heartbeat after its first is the insert alone, checking the token. Once revoked, the
    job token's heartbeat is a 401 storing nothing, and so is a revoked member's (not the 403 a member
    gets while its token works); a heartbeat on another job is a 404 either way while the token works."""
    admin = env.headers(env.token("admin"))
    job_id, other = _job(env, admin), _job(env, admin)
    beat = {"kind": "heartbeat", "data": {"step": 1}}
    job_secret, member_secret = env.token("job", job_id=job_id), env.token("member", team="alpha")
    job, member = env.headers(job_secret), env.headers(member_secret)
    assert env.client.post(f"/v1/jobs/{job_id}/measurements", json=beat, headers=job).status_code == 201
    with statements(env) as seen:
        assert env.client.post(f"/v1/jobs/{job_id}/measurements", json=beat, headers=job).status_code == 201
    assert seen == ["INSERT measurements"]
    assert env.client.post(f"/v1/jobs/{other}/measurements", json=beat, headers=job).status_code == 404
    assert env.client.get("/v1/jobs?limit=1", headers=member).status_code == 200  # remembered
    assert env.client.post(f"/v1/jobs/{job_id}/measurements", json=beat, headers=member).status_code == 403
    second_job_secret = env.token("job", job_id=job_id)  # a remembered job token for each target below
    assert env.client.post(f"/v1/jobs/{job_id}/measurements", json=beat,
                           headers=env.headers(second_job_secret)).status_code == 201
    stored = env.client.get(f"/v1/jobs/{job_id}", headers=admin).json()["measurements"]["heartbeat"]
    for secret, target in ((job_secret, job_id), (second_job_secret, other), (member_secret, job_id)):
        assert env.app.state.known_tokens.principal(secret) is not None
        assert env.client.post(f"/v1/tokens/{secret.split('_')[1]}/revoke", headers=admin).status_code == 200
        r = env.client.post(f"/v1/jobs/{target}/measurements", json={**beat, "data": {"step": 2}},
                            headers=env.headers(secret))
        assert r.status_code == 401, r.text
    assert env.client.get(f"/v1/jobs/{job_id}", headers=admin).json()["measurements"]["heartbeat"] == stored


def test_a_remembered_token_id_with_another_secret_is_refused_and_evicts_nothing(env: Env) -> None:
    secret = env.token("admin")
    job_id = _job(env, env.headers(secret))
    assert _reads(env, env.headers(secret), job_id) == (200, 200, 200)
    forged = secret[:-4] + ("AAAA" if not secret.endswith("AAAA") else "BBBB")
    assert _reads(env, env.headers(forged), job_id) == (401, 401, 401)
    with statements(env) as seen:
        assert env.client.get(f"/v1/jobs/{job_id}", headers=env.headers(secret)).status_code == 200
    assert "SELECT api_tokens" not in seen  # still remembered


def test_the_statements_check_agrees_with_authenticate_at_every_boundary(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """`TOKEN_LIVE`, bound by `live_values` at an instant, against `authenticate` at the same instant,
    for tokens revoked or not, expiring just before, at or after it, and job tokens whose job ended
    just before, at or after the end of the grace (to the microsecond: how both databases store time)."""
    now = datetime(2026, 12, 6, 9, 30, 15, 123456, tzinfo=UTC)
    monkeypatch.setattr(tokens, "utcnow", lambda: now)
    grace = 300.0
    ended_by = now - timedelta(seconds=grace)
    tick = timedelta(microseconds=1)
    admin = env.token("admin")
    cases: list[tuple[str, str]] = []
    for revoked in (None, now - timedelta(days=1)):
        for expires in (None, now - tick, now, now + tick):
            secret = env.token("member", team="default", expires_at=expires)
            _set(env, ApiToken, secret.split("_")[1], revoked_at=revoked)
            cases.append((f"member revoked={revoked} expires={expires}", secret))
    for finished in (None, ended_by - tick, ended_by, ended_by + tick):
        job_id = _job(env, env.headers(admin))
        _set(env, Job, job_id, finished_at=finished)
        cases.append((f"job finished={finished}", env.token("job", job_id=job_id)))
    verdicts = []
    with one_statement(env.app.state.engine) as conn:
        for what, secret in cases:
            row = conn.execute(select(ApiToken.role, ApiToken.team_id, ApiToken.job_id)
                               .where(ApiToken.id == secret.split("_")[1])).one()
            principal = Principal(secret.split("_")[1], row.role, row.team_id, None, row.job_id)
            live = conn.execute(select(literal(1)).where(TOKEN_LIVE), live_values(principal, now, grace)).first()
            works = authenticate(conn, secret, job_token_grace_s=grace) is not None
            assert (live is not None) == works, what
            verdicts.append(works)
    # both answers occur at each boundary: expiring at `now` or ending at `ended_by` is the end
    assert verdicts == [True, False, False, True] + [False] * 4 + [True, False, False, True]


def test_known_tokens_keeps_what_authenticate_found_by_secret_and_at_most_its_size() -> None:
    known = KnownTokens(size=2)
    secrets = [f"shc_{i:016x}_secret-{i}" for i in range(3)]
    principals = [Principal(f"{i:016x}", Role.MEMBER, team_id=i) for i in range(3)]
    for secret, principal in zip(secrets, principals, strict=True):
        known.remember(secret, principal)
    assert len(known) == 2
    assert [known.principal(s) for s in secrets] == [None, principals[1], principals[2]]  # the oldest went
    assert known.principal(secrets[2].replace("secret", "forged")) is None
    assert known.principal("not-a-token") is None and known.principal("shc_x") is None
    known.forget(secrets[1].replace("secret", "forged"))
    assert known.principal(secrets[1]) == principals[1]
    known.forget(secrets[1])
    assert known.principal(secrets[1]) is None and len(known) == 1
