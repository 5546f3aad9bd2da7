"""The access log: one line per request with the route template, status, latency, principal id and
request id, never the token; JSON lines that parse; `shardctl serve` writes ours and not uvicorn's."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.db_fixtures import Env
from tests.log_capture import captured_logs
from tests.specs import tiny


def token_id(token: str) -> str:
    return token.split("_", 2)[1]


def test_a_request_logs_its_route_template_status_and_principal_never_the_token(env: Env) -> None:
    token = env.token("admin")
    headers = env.headers(token)
    with captured_logs() as logs:
        job_id = env.client.post("/v1/jobs", json=tiny(), headers=headers).json()["id"]
        got = env.client.get(f"/v1/jobs/{job_id}", headers=headers)
    assert got.status_code == 200
    posted, read = logs.records("shardctl.access")
    assert (posted["method"], posted["route"], posted["status"]) == ("POST", "/v1/jobs", 201)
    assert (read["method"], read["route"], read["status"]) == ("GET", "/v1/jobs/{job_id}", 200)
    for line in (posted, read):
        assert line["principal"] == token_id(token)  # the token's public id ...
        assert isinstance(line["latency_ms"], float) and line["latency_ms"] >= 0
        assert line["level"] == "INFO" and line["ts"].endswith("Z")
    assert read["request_id"] == got.headers["X-Request-ID"]
    secret = token.split("_", 2)[2]
    assert secret not in logs.text and "Bearer" not in logs.text  # ... never the token or its header


def test_refused_and_unmatched_requests_are_logged_without_a_principal(env: Env) -> None:
    bogus = "shc_0123456789abcdef_not-a-real-secret-at-all"
    with captured_logs() as logs:
        refused = env.client.post("/v1/jobs", json=tiny(), headers=env.headers(bogus))
        missing = env.client.get("/no/such/place")
    assert refused.status_code == 401 and missing.status_code == 404
    gate, nowhere = logs.records("shardctl.access")
    assert (gate["route"], gate["status"], gate["principal"]) == ("/v1/jobs", 401, None)
    assert (nowhere["route"], nowhere["status"], nowhere["principal"]) == ("unmatched", 404, None)
    assert "not-a-real-secret" not in logs.text and "/no/such/place" not in logs.text


def test_a_clients_request_id_is_kept_and_marks_the_lines_written_for_it(env: Env, admin: dict[str, str]) -> None:
    job_id = env.client.post("/v1/jobs", json=tiny(), headers=admin).json()["id"]
    with captured_logs() as logs:
        r = env.client.post(f"/v1/jobs/{job_id}/cancel", headers={**admin, "X-Request-ID": "trace-42.a"})
        odd = env.client.get("/healthz", headers={"X-Request-ID": "no spaces allowed"})
    assert r.headers["X-Request-ID"] == "trace-42.a"
    [moved] = logs.records("shardctl.jobs", job_id=job_id)  # the cancel's transition, under the same id
    assert (moved["from"], moved["to"], moved["request_id"]) == ("QUEUED", "CANCELLED", "trace-42.a")
    [access] = logs.records("shardctl.access", route="/v1/jobs/{job_id}/cancel")
    assert access["request_id"] == "trace-42.a"
    assert odd.headers["X-Request-ID"] != "no spaces allowed" and len(odd.headers["X-Request-ID"]) == 32


def test_text_format_names_the_same_fields_on_one_line(env: Env) -> None:
    token = env.token("admin")
    with captured_logs("text") as logs:
        env.client.get("/v1/jobs", headers=env.headers(token))
    [line] = [ln for ln in logs.text.splitlines() if "shardctl.access" in ln]
    assert " INFO shardctl.access GET /v1/jobs 200 " in line
    assert "route=/v1/jobs " in line and f"principal={token_id(token)}" in line and "status=200" in line
    assert token.split("_", 2)[2] not in logs.text


def test_serve_writes_json_lines_with_one_access_line_per_request_and_none_from_uvicorn(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = tmp_path / "cli.json"
    environ = {**os.environ, "SHARDCTL_DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite'}",
               "SHARDCTL_CONFIG": str(config), "SHARDCTL_DATA_DIR": str(tmp_path), "SHARDCTL_LOG_FORMAT": "json"}
    proc = subprocess.Popen([sys.executable, "-m", "service.cli.main", "serve", "--port", str(port)],
                            env=environ, stderr=subprocess.PIPE, text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{base}/healthz")
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and proc.poll() is None, "serve did not start"
                time.sleep(0.1)
        token = json.loads(config.read_text())["token"]
        who = httpx.get(f"{base}/v1/whoami", headers={"Authorization": f"Bearer {token}"})
        assert who.status_code == 200
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=30)
    lines = [json.loads(line) for line in stderr.splitlines() if line.strip()]  # every line parses
    whoami = [r for r in lines if r["logger"] == "shardctl.access" and r["route"] == "/v1/whoami"]
    assert len(whoami) == 1 and whoami[0]["principal"] == token_id(token) and whoami[0]["status"] == 200
    assert not [r for r in lines if r["logger"] == "uvicorn.access"]
    assert any(r["logger"] == "shardctl.cli" and r["message"].startswith("shardctl API on") for r in lines)
    assert token.split("_", 2)[2] not in stderr
