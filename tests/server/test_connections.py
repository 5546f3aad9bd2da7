"""What `shardctl serve` holds open (`service.cli.connections`), as real processes on 127.0.0.1: a request
whose headers stall is closed after SHARDCTL_HEADER_TIMEOUT_S, an idle kept-alive connection after
SHARDCTL_KEEPALIVE_TIMEOUT_S, and one client address holds at most SHARDCTL_MAX_CONNECTIONS_PER_CLIENT
connections (a process at most SHARDCTL_MAX_CONNECTIONS) while other clients are served."""

from __future__ import annotations

import resource
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest

from service.cli.connections import DEFAULT_MAX_CONNECTIONS, connection_cap
from tests.server.procs import environ, free_port, read_response, shardctl, stop, wait_serving, wait_until

HEADER_TIMEOUT_S = 1.0
KEEPALIVE_S = 2.0
HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
PARTIAL = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"


@contextmanager
def serving(tmp_path: Path, database_url: str, args: list[str], **settings: str) -> Iterator[int]:
    """`shardctl serve ARGS` on a free port of 127.0.0.1 with `settings`, until the block ends; yields the port."""
    port, log = free_port(), tmp_path / "serve.log"
    proc = shardctl(["serve", "--port", str(port), *args], environ(tmp_path, database_url, **settings), log)
    try:
        wait_serving(f"http://127.0.0.1:{port}", proc, log)
        yield port
    finally:
        stop(proc)


def connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))


def stalled(port: int, source: str = "127.0.0.1") -> socket.socket:
    """A connection that has sent part of a request's headers, and sends no more."""
    conn = connect(port, source)
    conn.sendall(PARTIAL)
    return conn


def closed_by(conn: socket.socket, deadline: float) -> bytes:
    """What `conn` receives until the server closes it; fails when it is still open at `deadline`
    (`time.monotonic()`)."""
    data = b""
    while True:
        conn.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = conn.recv(65536)
        except TimeoutError:
            raise AssertionError(f"still open at the deadline, having received {data!r}") from None
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def still_open(conn: socket.socket) -> bool:
    """Whether the server has neither closed `conn` nor written to it (a held connection it has not read
    a whole request from)."""
    conn.settimeout(0.2)
    try:
        conn.recv(1)
    except TimeoutError:
        return True
    except ConnectionResetError:
        return False
    return False


def health(port: int, source: str) -> int | None:
    """GET /healthz on a new connection from `source`: the status, or None when the connection was closed
    before an answer."""
    with httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=10) as client:
        try:
            return client.get(f"http://127.0.0.1:{port}/healthz").status_code
        except httpx.TransportError:
            return None


@contextmanager
def two_workers(database_url: str, tmp_path: Path, keepalive_s: float) -> Iterator[int]:
    """`serve --workers 2` (each worker applies the bounds) with short timeouts; its port."""
    with serving(tmp_path, database_url, ["--workers", "2"], SHARDCTL_HEADER_TIMEOUT_S=str(HEADER_TIMEOUT_S),
                 SHARDCTL_KEEPALIVE_TIMEOUT_S=str(keepalive_s)) as port:
        yield port


def test_a_request_head_that_stalls_is_closed_after_the_header_timeout(fresh_postgres: str,
                                                                      tmp_path: Path) -> None:
    # Idle kept-alive connections outlive every bound below: only the header deadline closes them.
    with two_workers(fresh_postgres, tmp_path, keepalive_s=10 * HEADER_TIMEOUT_S) as port:
        with ExitStack() as stack:
            opened = time.monotonic()
            silent = stack.enter_context(connect(port))  # opens, and sends nothing
            # Several, so that both workers get some (the kernel spreads connections by address).
            partial = [stack.enter_context(stalled(port)) for _ in range(8)]
            for conn in [silent, *partial]:
                assert closed_by(conn, opened + 3 * HEADER_TIMEOUT_S) == b""

        # The deadline is each request's, not the connection's: a connection that lives longer than it,
        # its heads arriving in parts but each in time, is served; then a head that stalls is closed.
        with connect(port) as conn:
            began = time.monotonic()
            while time.monotonic() - began < 2 * HEADER_TIMEOUT_S:
                conn.sendall(PARTIAL)
                time.sleep(0.3)
                conn.sendall(b"\r\n")
                assert read_response(conn).startswith("HTTP/1.1 200")
                time.sleep(0.3)
            conn.sendall(PARTIAL)
            assert closed_by(conn, time.monotonic() + 3 * HEADER_TIMEOUT_S) == b""

        # Two requests and the start of a third in one write (pipelined): two answers, then closed.
        with connect(port) as conn:
            conn.sendall(HEALTHZ + HEALTHZ + PARTIAL)
            answers = closed_by(conn, time.monotonic() + 3 * HEADER_TIMEOUT_S)
            assert answers.count(b"HTTP/1.1 200 ") == 2, answers


def test_an_idle_kept_alive_connection_is_closed_after_the_keepalive_timeout(fresh_postgres: str,
                                                                             tmp_path: Path) -> None:
    with two_workers(fresh_postgres, tmp_path, keepalive_s=KEEPALIVE_S) as port, connect(port) as conn:
        conn.sendall(HEALTHZ)
        assert read_response(conn).startswith("HTTP/1.1 200")
        # Idle longer than the header timeout, less than the keep-alive one: the header deadline only
        # starts with a request's first byte.
        time.sleep(HEADER_TIMEOUT_S + 0.3)
        conn.sendall(HEALTHZ)
        assert read_response(conn).startswith("HTTP/1.1 200")
        # Closed well before uvicorn's own default (5 s) would close it.
        assert closed_by(conn, time.monotonic() + KEEPALIVE_S + 2.5) == b""


def test_one_client_holds_at_most_its_cap_while_others_are_served(tmp_path: Path) -> None:
    settings = dict(SHARDCTL_MAX_CONNECTIONS_PER_CLIENT="3", SHARDCTL_MAX_CONNECTIONS="8",
                    SHARDCTL_CONNECTION_CAP_EXEMPT='["127.0.0.3/32"]', SHARDCTL_HEADER_TIMEOUT_S="60")
    with serving(tmp_path, f"sqlite:///{tmp_path / 'db.sqlite'}", [], **settings) as port, ExitStack() as stack:
        held = [stack.enter_context(stalled(port)) for _ in range(3)]
        # One more from the same address: answered 503 and closed, before anything is read from it.
        with connect(port) as extra:
            assert closed_by(extra, time.monotonic() + 10).startswith(b"HTTP/1.1 503 ")
        assert all(still_open(conn) for conn in held)
        # Another client is served meanwhile; this one is refused while it holds its three.
        assert health(port, "127.0.0.2") == 200
        assert health(port, "127.0.0.1") in (503, None)

        # An exempt address (a proxy) holds more than the per-client cap, up to the cap on all (8).
        exempt = [stack.enter_context(stalled(port, "127.0.0.3")) for _ in range(5)]
        with connect(port, "127.0.0.2") as over:
            assert closed_by(over, time.monotonic() + 10).startswith(b"HTTP/1.1 503 ")
        assert all(still_open(conn) for conn in [*held, *exempt])

        for conn in [*exempt, held[0]]:
            conn.close()
        wait_until(lambda: health(port, "127.0.0.1") == 200, "a request from 127.0.0.1 once it holds two",
                   timeout=30)
        assert health(port, "127.0.0.2") == 200


@pytest.mark.parametrize(("soft", "requested", "cap", "warned"), [
    (1024, None, 768, False),  # the default, lowered to leave 256 descriptors
    (1024, 500, 500, False),
    (1024, 2000, 768, True),  # asked for more than the limit leaves: lowered, and said
    (300, None, 150, False),  # a small limit: half of it is left to the rest of the process
    (65536, None, DEFAULT_MAX_CONNECTIONS, False),
    (resource.RLIM_INFINITY, 100_000, 100_000, False),
])
def test_the_cap_on_all_connections_stays_below_the_open_file_limit(
        monkeypatch: pytest.MonkeyPatch, soft: int, requested: int | None, cap: int, warned: bool) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda which: (soft, resource.RLIM_INFINITY))
    got, warning = connection_cap(requested)
    assert got == cap
    assert (warning is not None) == warned
    if warning is not None:
        assert "SHARDCTL_MAX_CONNECTIONS=2000" in warning and "768" in warning
