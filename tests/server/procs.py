"""Real `shardctl` processes for the server tests: start, wait, signal; a fresh PostgreSQL database; a TCP
forwarder to take a database away under a running server."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.db_fixtures import _postgres_base

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def read_response(conn: socket.socket) -> str:
    """One whole HTTP/1.1 response (headers, then Content-Length bytes of body) read from `conn`."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        assert chunk, f"connection closed after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        chunk = conn.recv(65536)
        assert chunk, "connection closed mid-body"
        body += chunk
    return (head + b"\r\n\r\n" + body).decode()


def bootstrap_token() -> str:
    """A value of the form SHARDCTL_BOOTSTRAP_ADMIN_TOKEN takes (as the Helm chart generates one)."""
    return f"shc_{secrets.token_hex(8)}_{secrets.token_urlsafe(32)}"


def environ(tmp_path: Path, database_url: str, **extra: str) -> dict[str, str]:
    """This environment without the caller's SHARDCTL_* settings, plus the test's database, data dir and config."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDCTL_") or k.startswith("SHARDCTL_TEST_")}
    env.update(SHARDCTL_DATABASE_URL=database_url, SHARDCTL_DATA_DIR=str(tmp_path / "data"),
               SHARDCTL_CONFIG=str(tmp_path / "cli.json"), **extra)
    return env


def shardctl(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """`shardctl ARGS` as its own process, stdout and stderr to `log` (a file never blocks the process)."""
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "service.cli.main", *args], cwd=ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT)


def run_shardctl(args: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "service.cli.main", *args], cwd=ROOT, env=env, timeout=timeout,
                          capture_output=True, text=True, check=False)


def wait_until(check: Callable[[], Any], what: str, timeout: float = 60, proc: subprocess.Popen[bytes] | None = None,
               log: Path | None = None) -> Any:
    """Poll `check` until it returns something truthy; fail naming `what` (and the process's log) otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with suppress(httpx.TransportError):
            found = check()
            if found:
                return found
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.05)
    output = log.read_text(errors="replace")[-4000:] if log is not None and log.exists() else ""
    raise AssertionError(f"{what}: not within {timeout:.0f} s (exit {proc.poll() if proc else None})\n{output}")


def wait_serving(base: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    wait_until(lambda: httpx.get(f"{base}/healthz", timeout=2).status_code == 200, f"{base} serving", proc=proc,
               log=log, timeout=120)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Clean up after a test that failed half-way: SIGTERM, then SIGKILL."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def fresh_postgres() -> Iterator[str]:
    """An empty PostgreSQL database of its own (nothing migrated), dropped at the end."""
    base = _postgres_base()
    if base is None:
        pytest.skip("PostgreSQL tests skipped: set SHARDCTL_TEST_POSTGRES_URL (scripts/test.sh starts one)")
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    name = f"shardctl_server_{secrets.token_hex(4)}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(base).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


class Forwarder:
    """A TCP forwarder on a free local port to `target`; `cut()` closes it and every connection through it,
    as a database host that goes away does."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self._cut = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self._cut:
                client.close()
                return
            upstream = socket.create_connection(self.target)
            with self._lock:
                self._open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def cut(self) -> None:
        """Stop accepting (a blocked accept() is woken: closing the socket alone would leave it listening)
        and close every connection through it."""
        self._cut = True
        with suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        with self._lock:
            for sock in self._open:
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()


@contextmanager
def forwarded_database(url: str) -> Iterator[tuple[str, Forwarder]]:
    """`url` rewritten to go through a `Forwarder`, and the forwarder."""
    parsed = make_url(url)
    forwarder = Forwarder((parsed.host or "127.0.0.1", parsed.port or 5432))
    try:
        yield parsed.set(host="127.0.0.1", port=forwarder.port).render_as_string(hide_password=False), forwarder
    finally:
        forwarder.cut()
