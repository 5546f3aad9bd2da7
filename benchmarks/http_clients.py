"""The load generator's HTTP/1.1 clients: httpx, as a user's tooling would send, and a lean one.

The load generator shares the machine's CPUs with the server it measures. httpx spent 4-5 ms of CPU
per request here (`api_load --client httpx`, `/healthz`, 16 clients), which on a 2-core machine is CPU
the server does not get: the figures then measure the client as much as the server. `LeanClient` sends
prebuilt request bytes over keep-alive sockets (uvloop when installed) and reads a `Content-Length`
answer, as load tools written in C (wrk, ab) do, at about 0.1 ms per request. Both give
`(status, body)` for a request, so a benchmark runs the same phases with either and prints which.

Benchmarks import this module by its bare name (`from http_clients import ...`), as `scratch_db`.
"""

from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import Callable, Mapping
from typing import Any, Protocol
from urllib.parse import urlencode, urlsplit

import httpx


class Client(Protocol):
    async def request(self, method: str, path: str, *, json_body: Any = None,
                      params: Mapping[str, str | int] | None = None) -> tuple[int, bytes]:
        """Send one request; (HTTP status, body). Raises `ConnectionError` or `httpx.HTTPError` on a
        transport failure."""
        ...

    async def aclose(self) -> None: ...


class HttpxClient:
    """One `httpx.AsyncClient` with `size` keep-alive connections shared by the callers."""

    def __init__(self, base: str, token: str, size: int) -> None:
        limits = httpx.Limits(max_connections=size, max_keepalive_connections=size)
        self.client = httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30,
                                        limits=limits)

    async def request(self, method: str, path: str, *, json_body: Any = None,
                      params: Mapping[str, str | int] | None = None) -> tuple[int, bytes]:
        response = await self.client.request(method, path, json=json_body, params=params)
        return response.status_code, response.content

    async def aclose(self) -> None:
        await self.client.aclose()


class LeanClient:
    """`size` keep-alive connections, each used by one caller at a time (a pool of idle ones).

    Sends `METHOD path HTTP/1.1` with the token, and a JSON body when given; reads the status line,
    the headers and `Content-Length` bytes. Answers without `Content-Length` (chunked, streams) are
    not supported: the routes it drives answer with a length."""

    def __init__(self, base: str, token: str, size: int) -> None:
        parts = urlsplit(base)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.head = (f"Host: {parts.netloc}\r\nAuthorization: Bearer {token}\r\n"
                     "Accept: application/json\r\n").encode()
        self.idle: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter] | None] = asyncio.Queue()
        for _ in range(size):
            self.idle.put_nowait(None)  # opened on first use
        self.open: list[asyncio.StreamWriter] = []

    async def request(self, method: str, path: str, *, json_body: Any = None,
                      params: Mapping[str, str | int] | None = None) -> tuple[int, bytes]:
        target = f"{path}?{urlencode(params)}" if params else path
        body = b"" if json_body is None else json.dumps(json_body, separators=(",", ":")).encode()
        message = b"".join((f"{method} {target} HTTP/1.1\r\n".encode(), self.head,
                            (b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)) if body
                            else b"", b"\r\n", body))
        conn = await self.idle.get()
        try:
            if conn is None:
                reader, writer = await asyncio.open_connection(self.host, self.port)
                self.open.append(writer)
                conn = reader, writer
            reader, writer = conn
            writer.write(message)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
                    break
            content = await reader.readexactly(length) if length else b""
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            if conn is not None:
                conn[1].close()
            self.idle.put_nowait(None)
            raise ConnectionError(f"{method} {target}: {exc!r}") from exc
        self.idle.put_nowait(conn)
        return status, content

    async def aclose(self) -> None:
        for writer in self.open:
            writer.close()
        self.open.clear()


CLIENTS: dict[str, Callable[[str, str, int], Client]] = {"lean": LeanClient, "httpx": HttpxClient}
"""Name -> a client for (base URL, bearer token, connections)."""


def run(main: Any, client: str) -> Any:
    """Run the coroutine `main` for `client`: the lean client on uvloop when it is installed
    (uvicorn[standard] brings it), httpx on asyncio's own loop as its users run it. The cyclic
    collector is paused while `main` runs, after one full pass: a full pass in the load generator
    stalls every request in flight, which a server's latency figures would then carry (in api_load's
    process, which holds the seeding's objects, they took 45 to 65 ms, 13 of them in one run)."""
    gc.collect()
    gc.disable()
    try:
        return _run(main, client)
    finally:
        gc.enable()


def _run(main: Any, client: str) -> Any:
    if client != "lean":
        return asyncio.run(main)
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)
