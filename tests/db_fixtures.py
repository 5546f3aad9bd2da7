"""API fixtures: every test that takes `db_url` runs on SQLite and on a real PostgreSQL.

PostgreSQL comes from SHARDCTL_TEST_POSTGRES_URL (scripts/test.sh sets it from deploy/postgres.sh).
Without it the PostgreSQL runs skip with the reason, except under CI=true, where they fail.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from service.api.app import create_app
from service.api.ui.session import COOKIE
from service.settings import Settings
from service.store import migrate
from service.store.db import make_engine, private_sqlite_file
from service.store.schema import metadata
from service.store.tokens import create_token, ensure_team

PG_ENV = "SHARDCTL_TEST_POSTGRES_URL"


def _postgres_base() -> str | None:
    url = os.environ.get(PG_ENV)
    if url:
        return url
    if os.environ.get("CI"):
        pytest.fail(f"{PG_ENV} is not set: CI must run the PostgreSQL tests (scripts/test.sh starts it)")
    return None


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A fresh, migrated PostgreSQL database for this test session, dropped at the end."""
    base = _postgres_base()
    if base is None:
        pytest.skip(f"PostgreSQL tests skipped: set {PG_ENV} (or run scripts/test.sh, which starts one)")
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    name = f"shardctl_test_{secrets.token_hex(4)}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"PostgreSQL at {make_url(base).host} unusable: {exc}")
    url = make_url(base).set(database=name).render_as_string(hide_password=False)
    migrate.upgrade(url)
    yield url
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def _truncate(url: str) -> None:
    """Every table emptied and every sequence back at 1, as `TRUNCATE ... RESTART IDENTITY` leaves them.
    Row by row: a test leaves a few rows, and a `TRUNCATE` of every table costs about 0.1 s, 30 times this."""
    engine = create_engine(url)
    with engine.begin() as conn:
        for table in reversed(metadata.sorted_tables):  # the rows that refer to others first
            conn.execute(table.delete())
        conn.execute(text("SELECT setval(c.oid, 1, false) FROM pg_class c WHERE c.relkind = 'S'"))
    engine.dispose()


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated to head once a session; each test's SQLite database is a copy of it
    (migrating a new file takes about 0.1 s; the migrations themselves are tested on their own)."""
    path = tmp_path_factory.mktemp("migrated") / "shardctl.db"
    migrate.upgrade(f"sqlite:///{path}")
    assert not path.with_name(path.name + "-wal").exists(), "the migration left a write-ahead log behind"
    return path


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated, empty database: a new SQLite file, or the session's PostgreSQL database truncated."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'shardctl.db'}"
        private_sqlite_file(url)  # as `migrate.upgrade` makes it: 0600, which the copy keeps
        shutil.copyfile(request.getfixturevalue("migrated_sqlite"), tmp_path / "shardctl.db")
        return url
    url: str = request.getfixturevalue("postgres_url")
    _truncate(url)
    return url


@dataclass
class Env:
    """An app on one database, with helpers to mint tokens straight in the store."""

    app: FastAPI
    client: TestClient
    url: str

    def token(self, role: str = "admin", team: str | None = None, job_id: int | None = None,
              **kw: object) -> str:
        sessions = self.app.state.sessions
        with sessions.begin() as session:
            team_row = ensure_team(session, team) if team else None
            _, secret = create_token(session, role=role, team=team_row, job_id=job_id, **kw)  # type: ignore[arg-type]
        return secret

    def headers(self, token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    def sign_in_ui(self, token: str) -> str:
        """Sign in to the dashboard with `token` through its form, as a browser does: `client` then holds
        the session's cookie (any earlier one is dropped first). Returns the session's CSRF token, as the
        page signed in to carries it."""
        self.client.cookies.delete(COOKIE)
        form = self.client.get("/ui/login")
        nonce = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert form.status_code == 200 and nonce is not None, form.text[:500]
        done = self.client.post("/ui/login", data={"token": token, "csrf": nonce.group(1), "next": "/ui/jobs"},
                                follow_redirects=False)
        assert done.status_code == 303 and done.headers["location"] == "/ui/jobs", done.text[:500]
        page = self.client.get("/ui/jobs")
        csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert page.status_code == 200 and csrf is not None, page.text[:500]
        return csrf.group(1)


def _env(url: str, tmp_path: Path, **settings: Any) -> Iterator[Env]:
    engine = make_engine(url)
    app = create_app(Settings(database_url=url, data_dir=tmp_path, events_poll_s=0.05, **settings), engine=engine)
    try:
        with TestClient(app) as client:
            yield Env(app=app, client=client, url=url)
    finally:
        engine.dispose()


@contextmanager
def app_env(url: str, tmp_path: Path, **settings: Any) -> Iterator[Env]:
    """The API on `url` as the `env` fixture makes it, with `settings` (Settings' fields) changed."""
    yield from _env(url, tmp_path, **settings)


@pytest.fixture
def env(db_url: str, tmp_path: Path) -> Iterator[Env]:
    """The API on each database in turn."""
    yield from _env(db_url, tmp_path)


@pytest.fixture
def pg_env(postgres_url: str, tmp_path: Path) -> Iterator[Env]:
    """The API on PostgreSQL only, for what only PostgreSQL offers (replicas sharing one queue)."""
    _truncate(postgres_url)
    yield from _env(postgres_url, tmp_path)


@pytest.fixture
def admin(env: Env) -> dict[str, str]:
    return env.headers(env.token("admin"))


class LiveServer:
    """uvicorn serving an app on a free localhost port, in a background thread."""

    def __init__(self, app: FastAPI) -> None:
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def live(env: Env) -> Iterator[str]:
    with LiveServer(env.app) as url:
        yield url


@pytest.fixture
def admin_cli(env: Env, live: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., tuple[int, str]]:
    """Run `shardctl ...` in-process against the live server as an admin, with a fresh config file;
    returns (exit code, output)."""
    from typer.testing import CliRunner

    from service.cli.main import app

    monkeypatch.setenv("SHARDCTL_CONFIG", str(tmp_path / "cli.json"))
    monkeypatch.setenv("SHARDCTL_URL", live)
    monkeypatch.setenv("SHARDCTL_TOKEN", env.token("admin"))
    runner = CliRunner()

    def run(*args: str) -> tuple[int, str]:
        result = runner.invoke(app, list(args))
        return result.exit_code, result.output

    return run


__all__ = ["Env", "LiveServer"]
