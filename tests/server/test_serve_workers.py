"""`shardctl serve --workers N`'s supervision (`service.cli.serve_workers`), as real processes:
connections opened together spread over the workers, a worker that dies is replaced, the workers stop
when serve is killed, a port in use and a worker that cannot start are refused at once."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.api.routers.health import PID_HEADER
from service.cli.serve_workers import serve_workers
from tests.server.procs import (
    environ,
    free_port,
    read_response,
    run_shardctl,
    shardctl,
    stop,
    wait_serving,
    wait_until,
)


def _worker_of(conn: socket.socket) -> int:
    conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    head = read_response(conn).partition("\r\n\r\n")[0]
    return next(int(line.split(":", 1)[1]) for line in head.split("\r\n")
                if line.lower().startswith(PID_HEADER.lower() + ":"))


def holders(port: int, connections: int = 16) -> list[int]:
    """The worker pid behind each of `connections` keep-alive connections, all opened before any
    request is sent: what a sweep script's clients do when they start together."""
    conns = [socket.create_connection(("127.0.0.1", port), timeout=15) for _ in range(connections)]
    try:
        return [_worker_of(conn) for conn in conns]
    finally:
        for conn in conns:
            conn.close()


Serving = tuple[int, subprocess.Popen[bytes], Path]
"""The port, the serve process and its log."""


@pytest.fixture
def two_workers(fresh_postgres: str, tmp_path: Path) -> Iterator[Serving]:
    port, log = free_port(), tmp_path / "serve.log"
    proc = shardctl(["serve", "--workers", "2", "--port", str(port)], environ(tmp_path, fresh_postgres), log)
    wait_serving(f"http://127.0.0.1:{port}", proc, log)
    # Both workers serving: the first to start answers /healthz before the second has bound its socket.
    wait_until(lambda: len(set(holders(port))) == 2, "both workers answering", proc=proc, log=log)
    yield port, proc, log
    stop(proc)


def test_connections_opened_together_are_spread_over_the_workers(two_workers: Serving) -> None:
    port, _, _ = two_workers
    # One shared socket gave all 16 to one worker in one round of three or more; a socket per worker
    # splits them by hash, so that a worker holds none in a round has odds of 2 in 65,536.
    for _ in range(8):
        split = sorted(Counter(holders(port)).values())
        assert len(split) == 2 and sum(split) == 16, split


def test_a_worker_that_dies_is_replaced(two_workers: Serving) -> None:
    port, proc, log = two_workers
    first = set(holders(port))
    victim = min(first)
    os.kill(victim, signal.SIGKILL)

    def replaced() -> set[int] | None:
        try:
            now = set(holders(port))
        except ConnectionResetError:  # a connection queued on the dead worker's socket as it closed
            return None
        return now if len(now) == 2 and victim not in now else None

    after = wait_until(replaced, "a new worker in the dead one's place", proc=proc, log=log)
    assert first - {victim} < after
    assert proc.poll() is None
    assert f"API worker {victim} died" in log.read_text()


def _gone(pid: int) -> bool:
    """No such process, or only its zombie (an orphan's exit is reaped by whatever adopted it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_the_workers_stop_when_serve_is_killed(two_workers: Serving) -> None:
    port, proc, log = two_workers
    workers = set(holders(port))
    proc.kill()  # SIGKILL: no chance to stop them itself, as under the OOM killer
    proc.wait()
    try:
        wait_until(lambda: all(_gone(pid) for pid in workers), "the orphaned workers gone", log=log, timeout=30)
    finally:
        for pid in workers:  # whatever happened, no orphan outlives the test
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    with pytest.raises(ConnectionRefusedError):  # the port is free for the next serve
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def test_a_port_in_use_is_one_line_naming_it(fresh_postgres: str, tmp_path: Path) -> None:
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        done = run_shardctl(["serve", "--workers", "2", "--port", str(port)], environ(tmp_path, fresh_postgres))
    assert done.returncode == 1, done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr and "--port" in done.stderr


def test_a_worker_that_cannot_start_stops_serving_with_status_1() -> None:
    # The app cannot be imported: every worker would fail the same way, so none is started again.
    status = serve_workers("tests.server.no_such_module:app", workers=2, host="127.0.0.1", port=free_port(),
                           log_config=None)
    assert status == 1
