"""`shardctl serve` as a production server, as real processes: several workers on PostgreSQL, the
graceful-shutdown contract (SIGTERM: stop taking requests, finish those in flight, exit 0), readiness
(503 naming the cause), the public URL jobs call back on, and a database that does not work as one line."""

from __future__ import annotations

import json
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, select

from service.api.routers.health import PID_HEADER
from service.cli import wiring
from service.settings import Settings
from service.store import migrate
from service.store.models import Team
from tests.server.procs import (
    bootstrap_token,
    environ,
    forwarded_database,
    free_port,
    read_response,
    run_shardctl,
    shardctl,
    stop,
    wait_serving,
    wait_until,
)
from tests.specs import tiny


def _pids(base: str, rounds: int = 20) -> set[int]:
    """The worker pids that answered `/healthz`: batches of concurrent requests on fresh connections
    until two answered (the kernel hands each connection to one worker's socket, by a hash of its address)."""
    seen: set[int] = set()

    def one(_: int) -> int:
        return int(httpx.get(f"{base}/healthz", timeout=10).headers[PID_HEADER])

    with ThreadPoolExecutor(8) as pool:
        for _ in range(rounds):
            seen |= set(pool.map(one, range(16)))
            if len(seen) >= 2:
                break
    return seen


def test_two_workers_answer_and_sigterm_finishes_the_request_in_flight_then_exits_0(
        fresh_postgres: str, tmp_path: Path) -> None:
    port, log, token = free_port(), tmp_path / "serve.log", bootstrap_token()
    pools = tmp_path / "pools.yaml"
    pools.write_text("pools: [{name: shared-cpu, backend: local, gpu: cpu, gpus: 8}]\n")
    env = environ(tmp_path, fresh_postgres, SHARDCTL_BOOTSTRAP_ADMIN_TOKEN=token, SHARDCTL_SHUTDOWN_GRACE_S="15",
                  SHARDCTL_POOLS_FILE=str(pools))
    proc = shardctl(["serve", "--workers", "2", "--host", "0.0.0.0", "--port", str(port), "--with-dispatcher"],
                    env, log)
    base, auth = f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {token}"}
    try:
        wait_serving(base, proc, log)
        parent_children = {int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()}
        answered = _pids(base)
        assert len(answered) == 2 and answered <= parent_children, (answered, parent_children)
        # Each worker opened its own store and sees what serve loaded (the pools file, the bootstrap admin).
        assert httpx.get(f"{base}/v1/whoami", headers=auth).json()["role"] == "admin"
        assert not (tmp_path / "cli.json").exists()  # with the bootstrap token, no other first admin is made
        assert [p["name"] for p in httpx.get(f"{base}/v1/pools", headers=auth).json()] == ["shared-cpu"]
        # --host 0.0.0.0 without SHARDCTL_PUBLIC_URL: jobs are told this machine's hostname, in every worker.
        launch = httpx.post(f"{base}/v1/plans", json=tiny(), headers=auth).json()["launch"]
        assert launch["content"]["env"]["SHARDCTL_URL"] == f"http://{socket.gethostname()}:{port}"
        started = log.read_text()
        assert f"jobs call back on http://{socket.gethostname()}:{port}" in started and token not in started
        assert started.count("running in this process") == 1  # one dispatcher, in the parent
        assert "local jobs run as this server's own OS user" in started and "SHARDCTL_LOCAL_RUN_AS" in started

        body = json.dumps({"name": "drained"}).encode()
        head = (f"POST /v1/teams HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        with socket.create_connection(("127.0.0.1", port)) as slow:
            slow.settimeout(15)
            # A first request on this connection, answered: a worker has accepted it and reads what comes next.
            slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert read_response(slow).startswith("HTTP/1.1 200")
            slow.sendall(head + body[:4])  # in flight: the worker waits for the rest of the body
            time.sleep(0.2)  # (ordering only: the headers reach the worker before the signal does)
            proc.send_signal(signal.SIGTERM)

            def refused_new_requests() -> bool:
                try:
                    httpx.get(f"{base}/healthz", timeout=0.5)
                except httpx.TransportError:
                    return True
                return False

            wait_until(refused_new_requests, "serve to stop taking new requests", timeout=15)
            slow.sendall(body[4:])
            answer = read_response(slow)
        assert answer.startswith("HTTP/1.1 201"), answer
        assert proc.wait(timeout=30) == 0, log.read_text()[-3000:]
        engine = create_engine(fresh_postgres)
        with engine.connect() as conn:
            assert conn.scalar(select(Team.name).where(Team.name == "drained")) == "drained"
        engine.dispose()
        assert "dispatcher stopped" in log.read_text() and token not in log.read_text()
    finally:
        stop(proc)


def test_readiness_names_pending_migrations_and_a_database_that_went_away(fresh_postgres: str,
                                                                          tmp_path: Path) -> None:
    port, log = free_port(), tmp_path / "serve.log"
    with forwarded_database(fresh_postgres) as (through, forwarder):
        proc = shardctl(["serve", "--port", str(port)], environ(tmp_path, through), log)
        base = f"http://127.0.0.1:{port}"
        try:
            wait_serving(base, proc, log)
            assert httpx.get(f"{base}/readyz").json() == {"status": "ready"}
            head = migrate.current_revision(fresh_postgres)
            assert head is not None

            migrate.downgrade(fresh_postgres, "-1")  # as a newer release's code sees a database not yet upgraded
            pending = httpx.get(f"{base}/readyz")
            assert pending.status_code == 503
            message = pending.json()["error"]["message"]
            assert "migrations pending" in message and head in message and "shardctl db upgrade" in message

            migrate.upgrade(fresh_postgres)  # what `shardctl db upgrade` runs
            assert httpx.get(f"{base}/readyz").status_code == 200

            forwarder.cut()  # the database host goes away under the running server
            down = httpx.get(f"{base}/readyz", timeout=30)
            assert down.status_code == 503 and "database unreachable" in down.json()["error"]["message"]
            assert httpx.get(f"{base}/healthz").status_code == 200  # the process itself is fine

            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0, log.read_text()[-3000:]
        finally:
            stop(proc)


@pytest.mark.parametrize("command", [["serve"], ["worker"], ["db", "upgrade"], ["token", "create", "--admin"]])
def test_a_database_that_does_not_answer_is_one_line_naming_the_host(command: list[str], tmp_path: Path) -> None:
    closed = free_port()
    url = f"postgresql+psycopg://shardctl:hunter2secret@127.0.0.1:{closed}/shardctl"
    done = run_shardctl([*command, *(["--port", str(free_port())] if command == ["serve"] else [])],
                        environ(tmp_path, url))
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert "Traceback" not in done.stderr and "hunter2secret" not in done.stderr + done.stdout
    assert len(lines) == 1, done.stderr
    assert f"127.0.0.1:{closed}/shardctl" in lines[0] and "connection refused" in lines[0].lower()
    assert "is the database server running" in lines[0]


def test_a_sqlite_folder_that_cannot_be_created_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    done = run_shardctl(["db", "upgrade"], environ(tmp_path, f"sqlite:///{blocker}/sub/shardctl.db"))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"SQLite file {blocker}/sub/shardctl.db" in done.stderr


def test_a_pools_file_that_cannot_be_read_is_one_line(tmp_path: Path) -> None:
    done = run_shardctl(["worker", "--once"], environ(tmp_path, f"sqlite:///{tmp_path / 'db.sqlite'}",
                                                     SHARDCTL_POOLS_FILE=str(tmp_path / "missing.yaml")))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]  # after the migration's own lines on a new database
    assert last.startswith("error: SHARDCTL_POOLS_FILE:") and "missing.yaml" in last


def test_several_workers_on_sqlite_are_refused_naming_postgresql(tmp_path: Path) -> None:
    done = run_shardctl(["serve", "--workers", "2", "--port", str(free_port())],
                        environ(tmp_path, f"sqlite:///{tmp_path / 'db.sqlite'}"))
    assert done.returncode == 1 and "needs PostgreSQL" in done.stderr and "--workers 1" in done.stderr
    assert not (tmp_path / "db.sqlite").exists()  # refused before anything was created


def test_the_public_url_jobs_call_back_on() -> None:
    assert wiring.resolve_public_url(Settings(), "0.0.0.0", 8686)[0] == f"http://{socket.gethostname()}:8686"
    assert wiring.resolve_public_url(Settings(), "::", 1)[0] == f"http://{socket.gethostname()}:1"
    assert wiring.resolve_public_url(Settings(), "10.1.2.3", 80) == ("http://10.1.2.3:80", None)
    chosen = Settings(public_url="https://shardctl.example.com/")
    assert wiring.resolve_public_url(chosen, "0.0.0.0", 8686) == ("https://shardctl.example.com", None)
    assert wiring.local_url("0.0.0.0", 8686) == "http://127.0.0.1:8686"


def test_the_readiness_of_an_api_whose_database_port_is_closed(tmp_path: Path) -> None:
    """An API process whose database is not there at all (in-process: serve itself refuses to start)."""
    from fastapi.testclient import TestClient

    from service.api.app import create_app

    url = f"postgresql+psycopg://shardctl:x@127.0.0.1:{free_port()}/shardctl"
    with TestClient(create_app(Settings(database_url=url, data_dir=tmp_path))) as client:
        answer = client.get("/readyz")
    assert answer.status_code == 503 and "database unreachable" in answer.json()["error"]["message"]
    assert "127.0.0.1" not in answer.text  # where the database is stays in the server's log


@pytest.mark.parametrize("command", [["serve"], ["worker", "--once"], ["db", "upgrade"]])
def test_a_bad_setting_is_one_line_naming_its_variable(command: list[str], tmp_path: Path) -> None:
    done = run_shardctl(command, environ(tmp_path, f"sqlite:///{tmp_path / 'db.sqlite'}",
                                         SHARDCTL_FORWARDED_TRUSTED_PROXIES='["not-an-address"]',
                                         SHARDCTL_USAGE_BLEND="2"))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 2, done.stderr  # one per bad variable
    proxies = next(line for line in lines if "SHARDCTL_FORWARDED_TRUSTED_PROXIES" in line)
    assert "not-an-address" in proxies and "fix it or unset it" in proxies
    blend = next(line for line in lines if "SHARDCTL_USAGE_BLEND" in line)
    assert "'2'" in blend and "less than or equal to 1" in blend
    assert not (tmp_path / "db.sqlite").exists()  # refused before anything was opened
