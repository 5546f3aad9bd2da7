"""When the database drops the API's connections, requests go on; when it cannot be reached, every
answer is a 503 `database_unavailable` in the API's error shape, never a plain-text 500."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import make_url

from service.api.app import create_app
from service.settings import Settings
from service.store.db import make_engine
from tests.db_fixtures import Env
from tests.specs import tiny

APP_NAME = "shardctl-test-outages"


@pytest.fixture
def named_env(postgres_url: str, pg_env: Env, tmp_path: Path) -> Iterator[Env]:
    """The API on PostgreSQL through connections named `APP_NAME`, so that the test ends only its own."""
    url = make_url(postgres_url).update_query_dict({"application_name": APP_NAME}).render_as_string(
        hide_password=False)
    engine = make_engine(url)
    app = create_app(Settings(database_url=url, data_dir=tmp_path), engine=engine)
    try:
        with TestClient(app) as client:
            yield Env(app=app, client=client, url=url)
    finally:
        engine.dispose()


def terminate_own_connections(postgres_url: str) -> int:
    """End every server process of the test's connections, as an operator's `pg_terminate_backend` or a
    restart does, and wait until they are gone; returns how many there were."""
    libpq = make_url(postgres_url).set(drivername="postgresql").render_as_string(hide_password=False)
    query = "SELECT pid FROM pg_stat_activity WHERE application_name = %s"
    with psycopg.connect(libpq, autocommit=True) as conn:
        pids = [pid for (pid,) in conn.execute(query, (APP_NAME,)).fetchall()]
        for pid in pids:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        deadline = time.monotonic() + 30
        while conn.execute(query, (APP_NAME,)).fetchall():
            assert time.monotonic() < deadline, "the terminated connections did not end"
            time.sleep(0.05)
    return len(pids)


def test_requests_after_the_server_ended_every_pooled_connection_are_answered(named_env: Env,
                                                                               postgres_url: str) -> None:
    env = named_env
    admin = env.headers(env.token("admin"))
    for i in range(8):  # fill the pool with several connections
        assert env.client.post("/v1/jobs", json=tiny(name=f"before-{i}"), headers=admin).status_code == 201
    for round_ in range(3):
        assert terminate_own_connections(postgres_url) >= 1
        answers = [env.client.get("/v1/jobs", headers=admin).status_code for _ in range(10)]
        answers += [env.client.post("/v1/jobs", json=tiny(name=f"after-{round_}-{i}"), headers=admin).status_code
                    for i in range(5)]
        answers += [env.client.get("/healthz").status_code]
        assert set(answers) <= {200, 201}, answers


def test_an_unreachable_database_is_a_503_in_the_error_shape(tmp_path: Path) -> None:
    url = "postgresql+psycopg://nobody:nothing@127.0.0.1:9/none?connect_timeout=2"  # port 9: discard, closed
    engine = make_engine(url)
    app = create_app(Settings(database_url=url, data_dir=tmp_path), engine=engine)
    try:
        with TestClient(app, raise_server_exceptions=False) as client:
            headers = {"Authorization": "Bearer shc_0123456789abcdef_" + "x" * 32}
            for method, path, body in (("GET", "/v1/jobs", None), ("GET", "/v1/jobs/1", None),
                                       ("POST", "/v1/jobs", tiny()),
                                       ("POST", "/v1/jobs/1/measurements", {"kind": "heartbeat", "data": {}})):
                r = client.request(method, path, json=body, headers=headers)
                assert r.status_code == 503, (method, path, r.status_code, r.text)
                assert r.json()["error"]["code"] == "database_unavailable" and r.headers["Retry-After"] == "1"
    finally:
        engine.dispose()
