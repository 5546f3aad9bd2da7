"""Health, readiness, metrics, request limits and the OpenAPI document."""

from __future__ import annotations

from sqlalchemy import create_engine

from service.api.app import create_app
from service.settings import Settings
from tests.db_fixtures import Env
from tests.specs import tiny


def test_health_and_readiness(env: Env) -> None:
    assert env.client.get("/healthz").json() == {"status": "ok"}
    assert env.client.get("/readyz").json() == {"status": "ready"}


def test_readiness_fails_when_the_database_is_unreachable(tmp_path) -> None:
    from fastapi.testclient import TestClient

    engine = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none", pool_pre_ping=False)
    app = create_app(Settings(data_dir=tmp_path), engine=engine)
    with TestClient(app) as client:
        r = client.get("/readyz")
    assert r.status_code == 503 and r.json()["error"]["code"] == "unavailable"


def test_metrics_count_jobs_submissions_and_latency(env: Env, admin: dict[str, str]) -> None:
    """Totals by default: a scrape names no team (SHARDCTL_METRICS_TEAM_LABELS=true labels them;
    tests/api/test_secrets.py)."""
    env.client.post("/v1/teams", json={"name": "alpha"}, headers=admin)
    env.client.post("/v1/jobs", json=tiny(team="alpha"), headers=admin)
    env.client.post("/v1/jobs", json=tiny(team="alpha"), headers=admin)
    text = env.client.get("/metrics").text
    assert 'shardctl_jobs{status="QUEUED"} 2.0' in text
    assert "shardctl_job_submissions_total 2.0" in text and "alpha" not in text
    assert 'shardctl_http_request_duration_seconds_count{method="POST",route="/v1/jobs",status="201"} 2.0' in text


def test_oversized_bodies_are_refused(env: Env, admin: dict[str, str]) -> None:
    r = env.client.post("/v1/jobs", content=b"x" * (2 << 20), headers={**admin, "Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "too_large"


def test_malformed_json_is_a_400_with_the_stable_shape(env: Env, admin: dict[str, str]) -> None:
    r = env.client.post("/v1/jobs", content=b"{not json", headers={**admin, "Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_request"  # not JSON at all: not a spec


def test_openapi_is_served_with_every_resource(env: Env) -> None:
    paths = env.client.get("/openapi.json").json()["paths"]
    assert {"/v1/plans", "/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/events", "/v1/jobs/{job_id}/cancel",
            "/v1/teams", "/v1/tokens", "/v1/whoami", "/healthz", "/readyz", "/metrics"} <= set(paths)
    assert env.client.get("/docs").status_code == 200


def test_nul_characters_are_refused_before_reaching_the_database(env: Env, admin: dict[str, str]) -> None:
    assert env.client.get("/v1/jobs", params={"name": "a\x00b"}, headers=admin).status_code == 422
    spec = tiny(backend={"kind": "slurm", "partition": "gpu\x00"})
    r = env.client.post("/v1/jobs", json=spec, headers=admin)
    assert r.status_code == 422 and "NUL" in r.json()["error"]["message"]
    assert env.client.post("/v1/tokens/a%00b/revoke", headers=admin).status_code == 422
