"""Secrets at rest and in output: the spec's env is write-only in responses, previews redact
by value as well as by name, the SQLite file and the CLI config are created owner-only, /metrics names
no team and may need a token, and the last live admin token cannot be revoked."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import select, text

from service.api.app import create_app
from service.cli import client as cli_client
from service.jobenv import TOKEN
from service.redaction import REDACTED, is_secret_env, redact_env, redact_value
from service.settings import Settings
from service.spec import TrainingSpec
from service.store.db import make_engine, make_sessionmaker, private_sqlite_file
from service.store.models import Job, utcnow
from tests.db_fixtures import Env
from tests.specs import tiny, tiny_plan
from workers.backends.local import LocalBackend
from workers.dispatch.request import launch_preview

SECRET_ENV = {
    "WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567",
    "DATABASE_URL": "postgresql://trainer:hunter2@db.internal:5432/runs",
    "MODE": "a",
}


@pytest.fixture
def private_umask() -> Iterator[None]:
    """A permissive umask (the usual 022), so that only explicit modes make files private."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# -- the spec's env is write-only in API responses --------------------------------------------------


def test_job_responses_show_the_entrypoint_env_names_but_never_their_values(env: Env, admin: dict[str, str]) -> None:
    spec = tiny(entrypoint={"command": ["python", "-c", "pass"], "env": SECRET_ENV})
    created = env.client.post("/v1/jobs", json=spec, headers=admin)
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    member = env.headers(env.token("member", team=created.json()["team"]))
    for body in (created.json(), env.client.get(f"/v1/jobs/{job_id}", headers=admin).json(),
                 env.client.get(f"/v1/jobs/{job_id}", headers=member).json()):
        assert body["spec"]["entrypoint"]["env"] == dict.fromkeys(SECRET_ENV, REDACTED)
        assert "hunter2" not in json.dumps(body) and SECRET_ENV["WANDB_API_KEY"] not in json.dumps(body)
    with env.app.state.sessions.begin() as session:  # stored as given: the job gets its real values
        stored = session.scalar(select(Job).where(Job.id == job_id))
        assert stored is not None and stored.spec.entrypoint is not None
        assert stored.spec.entrypoint.env == SECRET_ENV


def test_credentials_in_the_command_line_are_hidden_from_job_responses_and_the_job_page(
        env: Env, admin: dict[str, str]) -> None:
    pat, password = "ghp_" + "a1B2" * 9, "s3cr3t-pw"
    command = ["python", "train.py", f"--db=postgresql://trainer:{password}@db.internal/runs", f"--token={pat}"]
    created = env.client.post("/v1/jobs", json=tiny(entrypoint={"command": command}), headers=admin)
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    env.sign_in_ui(admin["Authorization"].split()[1])
    page = env.client.get(f"/ui/jobs/{job_id}")
    assert page.status_code == 200
    for body in (created.text, env.client.get(f"/v1/jobs/{job_id}", headers=admin).text, page.text):
        assert password not in body and pat not in body
    shown = env.client.get(f"/v1/jobs/{job_id}", headers=admin).json()["spec"]["entrypoint"]["command"]
    assert shown == ["python", "train.py", f"--db=postgresql://trainer:{REDACTED}@db.internal/runs",
                     f"--token={REDACTED}"]
    with env.app.state.sessions.begin() as session:  # the job runs with the real command line
        stored = session.scalar(select(Job).where(Job.id == job_id))
        assert stored is not None and stored.spec.entrypoint is not None and stored.spec.entrypoint.command == command


def test_values_the_spec_marks_public_are_shown(env: Env, admin: dict[str, str]) -> None:
    spec = tiny(entrypoint={"command": ["python", "-c", "pass"], "env": {**SECRET_ENV, "MODE": "eval"},
                            "public_env": ["MODE"]})
    body = env.client.post("/v1/jobs", json=spec, headers=admin).json()
    assert body["spec"]["entrypoint"]["env"] == {**dict.fromkeys(SECRET_ENV, REDACTED), "MODE": "eval"}
    r = env.client.post("/v1/jobs", json=tiny(entrypoint={"command": ["x"], "env": {}, "public_env": ["NOPE"]}),
                        headers=admin)
    assert r.status_code == 422 and "does not set" in r.json()["error"]["message"]


# -- previews redact by value as well as by name ----------------------------------------------------


def test_previews_redact_credentials_by_value_as_well_as_by_name(tmp_path: Path) -> None:
    values = {
        "WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567",
        "HF_KEY": "anything",
        "DATABASE_URL": "postgresql://trainer:hunter2@db.internal:5432/runs",
        "NOTES": "clone with ghp_" + "a" * 36,
        "AWS_ID": "AKIAIOSFODNN7EXAMPLE",
        "SLACK_HOOK": "xoxb-1234567890-abcdefghij",
        "SESSION": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJlLWJ5dGVz",
        "ADMIN": "shc_0123456789abcdef_" + "s" * 43,
        "MODE": "a",
        "SITE": "https://example.com:8443/path@v2",
    }
    spec = TrainingSpec.model_validate(tiny(entrypoint={
        "command": ["python", "-m", "workers.runtime", "--token=ghp_" + "b" * 36], "env": values}))
    launch = launch_preview({"local": LocalBackend(tmp_path / "local")}, "http://x")(spec, tiny_plan())
    assert launch is not None
    shown = launch["content"]["env"]
    assert shown["WANDB_API_KEY"] == shown["HF_KEY"] == shown["SHARDCTL_JOB_TOKEN"] == REDACTED
    assert shown["DATABASE_URL"] == f"postgresql://trainer:{REDACTED}@db.internal:5432/runs"
    assert shown["NOTES"] == f"clone with {REDACTED}"
    assert shown["AWS_ID"] == shown["SLACK_HOOK"] == shown["SESSION"] == shown["ADMIN"] == REDACTED
    assert shown["MODE"] == "a" and shown["SITE"] == values["SITE"]  # a port and a path are no password
    assert launch["content"]["commands"][0][-1] == f"--token={REDACTED}"
    dumped = json.dumps(launch)
    for secret in ("hunter2", "AKIAIOSFODNN7EXAMPLE", "ghp_", "xoxb-", "eyJhbGci", "shc_0123"):
        assert secret not in dumped


@pytest.mark.parametrize(("value", "expected"), [
    ("mysql+pymysql://u:p%40ss@h/db", f"mysql+pymysql://u:{REDACTED}@h/db"),
    ("redis://:only-a-password@cache:6379/0", f"redis://:{REDACTED}@cache:6379/0"),
    ("http://host:8080/a@b", "http://host:8080/a@b"),
    ("ssh://git@github.com/org/repo", "ssh://git@github.com/org/repo"),
    ("github_pat_" + "x" * 30, REDACTED),
    ("hf_" + "Z" * 34, REDACTED),
    ("plain text", "plain text"),
])
def test_redact_value(value: str, expected: str) -> None:
    assert redact_value(value) == expected


def test_secret_names() -> None:
    assert all(is_secret_env(k) for k in ("WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "SSH_KEY",
                                          "DB_PASSWORD", "GH_TOKEN", "GOOGLE_APPLICATION_CREDENTIALS", "key"))
    assert not any(is_secret_env(k) for k in ("MODE", "KEYBOARD", "MONKEY", "PATH"))
    assert is_secret_env(TOKEN)  # the backends keep the job token secret by this rule alone
    assert redact_env({"A_KEY": "x", "B": "x"}) == {"A_KEY": REDACTED, "B": "x"}


# -- files holding secrets are created owner-only ---------------------------------------------------


def test_a_new_sqlite_database_is_created_0600_before_the_engine_opens_it(tmp_path: Path, private_umask: None) -> None:
    path = tmp_path / "shardctl.db"
    engine = make_engine(f"sqlite:///{path}")
    with make_sessionmaker(engine).begin() as session:
        session.execute(text("CREATE TABLE t (x INTEGER)"))
        session.execute(text("INSERT INTO t VALUES (1)"))
        assert mode(path) == 0o600
        assert mode(path.with_name(path.name + "-wal")) == 0o600  # SQLite copies the database file's mode
    engine.dispose()
    nested = tmp_path / "new" / "data" / "shardctl.db"
    make_engine(f"sqlite:///{nested}").dispose()
    assert mode(nested) == 0o600 and mode(nested.parent) == 0o700


def test_an_existing_sqlite_file_loses_group_and_other_access(tmp_path: Path, private_umask: None) -> None:
    path = tmp_path / "old.db"
    path.touch(mode=0o644)
    assert mode(path) == 0o644
    assert private_sqlite_file(f"sqlite:///{path}") == path and mode(path) == 0o600
    assert private_sqlite_file("postgresql+psycopg://u@h/db") is None and private_sqlite_file("sqlite://") is None


def test_the_cli_config_is_created_0600_and_never_chmoded(tmp_path: Path, private_umask: None,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Written then chmod'ed, the token would be world-readable between the two."""
    def no_chmod(*_: object, **__: object) -> None:
        raise AssertionError("the config file must be created 0600, not chmod'ed afterwards")

    monkeypatch.setattr(os, "chmod", no_chmod)
    monkeypatch.setattr(Path, "chmod", no_chmod)
    config = tmp_path / "new" / "config.json"
    monkeypatch.setenv("SHARDCTL_CONFIG", str(config))
    assert cli_client.write_config(url="http://x", token="shc_a_b") == config
    cli_client.write_config(token="shc_c_d")
    assert json.loads(config.read_text()) == {"url": "http://x", "token": "shc_c_d"}
    assert mode(config) == 0o600 and mode(config.parent) == 0o700
    assert [p.name for p in config.parent.iterdir()] == ["config.json"]  # no temporary file left


# -- /metrics names no team and may need a token ----------------------------------------------------


def _app(env: Env, tmp_path: Path, **settings: object) -> TestClient:
    return TestClient(create_app(Settings(database_url=env.url, data_dir=tmp_path, **settings),  # type: ignore[arg-type]
                                 engine=make_engine(env.url)))


def test_metrics_name_no_team_unless_allowed(env: Env, admin: dict[str, str], tmp_path: Path) -> None:
    for team in ("secret-project", "other"):
        assert env.client.post("/v1/teams", json={"name": team}, headers=admin).status_code == 201
        assert env.client.post("/v1/jobs", json=tiny(team=team), headers=admin).status_code == 201
    scraped = env.client.get("/metrics").text
    assert "secret-project" not in scraped and "other" not in scraped
    assert 'shardctl_jobs{status="QUEUED"} 2.0' in scraped
    with _app(env, tmp_path, metrics_team_labels=True) as client:
        client.post("/v1/jobs", json=tiny(team="other"), headers=admin)
        labelled = client.get("/metrics").text
    assert 'shardctl_jobs{status="QUEUED",team="secret-project"} 1.0' in labelled
    assert 'shardctl_job_submissions_total{team="other"} 1.0' in labelled


def test_metrics_need_the_metrics_token_or_an_admin_when_one_is_set(env: Env, admin: dict[str, str],
                                                                    tmp_path: Path) -> None:
    member = env.headers(env.token("member", team="alpha"))
    with _app(env, tmp_path, metrics_token=SecretStr("scrape-me")) as client:
        missing = client.get("/metrics")
        wrong = client.get("/metrics", headers={"Authorization": "Bearer nope"})
        as_member = client.get("/metrics", headers=member)
        with_token = client.get("/metrics", headers={"Authorization": "Bearer scrape-me"})
        as_admin = client.get("/metrics", headers=admin)
    assert missing.status_code == wrong.status_code == 401
    assert missing.json()["error"]["code"] == "unauthorized" and "metrics token" in missing.json()["error"]["message"]
    assert as_member.status_code == 403
    assert with_token.status_code == as_admin.status_code == 200 and "shardctl_jobs" in with_token.text


# -- the last admin ---------------------------------------------------------------------------------


def _token_id(secret: str) -> str:
    return secret.split("_")[1]


def test_revoking_the_last_live_admin_token_is_a_409_naming_why(env: Env) -> None:
    first = env.token("admin")
    second = env.token("admin")
    expired = env.token("admin", expires_at=utcnow() - timedelta(seconds=1))
    assert env.client.post(f"/v1/tokens/{_token_id(second)}/revoke", headers=env.headers(first)).status_code == 200
    r = env.client.post(f"/v1/tokens/{_token_id(first)}/revoke", headers=env.headers(first))
    assert r.status_code == 409, r.text  # the expired admin token does not count
    error = r.json()["error"]
    assert error["code"] == "last_admin" and "last live admin token" in error["message"]
    assert env.client.get("/v1/whoami", headers=env.headers(first)).status_code == 200
    # Revoking an expired or already revoked admin token is fine.
    assert env.client.post(f"/v1/tokens/{_token_id(expired)}/revoke", headers=env.headers(first)).status_code == 200
    assert env.client.post(f"/v1/tokens/{_token_id(second)}/revoke", headers=env.headers(first)).status_code == 200
    third = env.token("admin")
    assert env.client.post(f"/v1/tokens/{_token_id(first)}/revoke", headers=env.headers(third)).status_code == 200


def test_only_expired_admin_tokens_mean_serve_bootstraps_a_new_one(env: Env) -> None:
    from service.cli import wiring

    sessions = env.app.state.sessions
    assert wiring.needs_first_admin(sessions)
    env.token("admin", expires_at=utcnow() - timedelta(seconds=1))
    assert wiring.needs_first_admin(sessions)
    env.token("admin")
    assert not wiring.needs_first_admin(sessions)
