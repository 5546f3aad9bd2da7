"""The connections `shardctl serve` holds open: a deadline for each request's headers, a cap on the
connections one client address holds, and a cap on all of them, in each API process (docs/server.md,
"Connections and slow clients").

uvicorn closes a kept-alive connection that idles between two requests (`timeout_keep_alive`), but it
gives a client all the time it wants to send a request's headers, and it takes every connection it is
offered. A client that opens connections and sends a byte now and then (slowloris) holds them for
ever, until the process runs out of file descriptors: then it accepts no other client, and nothing
else in it (the database pool, the embedded dispatcher) can open a socket or a file either.
`guarded_protocol` is uvicorn's httptools protocol (what it runs by default) with the three bounds:

- From the moment a connection opens, and from the first byte of each later request on it, the client
  has `header_timeout_s` to complete the request's headers, or the connection is closed. A request
  body being read and a response being written are not timed.
- A connection from an address that already holds `max_per_client` connections to this process is
  answered 503 and closed at once, before anything is read from it. Addresses in `exempt` (a reverse
  proxy that carries many clients' connections) are not capped.
- The same for a connection beyond `max_connections` in all, a number `connection_cap` keeps below
  the process's open-file limit.

The subclass overrides uvicorn's asyncio protocol methods, httptools' parser callbacks and uvicorn's
`handle_websocket_upgrade`, and calls the originals from each; pyproject.toml pins uvicorn's minor
version, under which these were checked. A connection upgraded to a WebSocket leaves the counts (its
protocol takes the connection over); the API has no WebSocket routes.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import resource
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.settings import Settings

log = logging.getLogger(__name__)

#: Connections one API process holds at most when SHARDCTL_MAX_CONNECTIONS is unset.
DEFAULT_MAX_CONNECTIONS = 4096
#: File descriptors the connection cap leaves to the rest of the process (the database pool, logs, the
#: embedded dispatcher and its backends): at most this many, and at most half the open-file limit.
FD_RESERVE = 256
#: A refusal is logged at most this often per reason; the line counts the refusals since the last one.
REFUSAL_LOG_S = 60.0

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class ConnectionLimits:
    """The bounds of one API process. Picklable: `serve --workers N` hands them to each worker."""

    header_timeout_s: float
    max_connections: int
    #: 0: no per-client cap.
    max_per_client: int
    #: Addresses or CIDRs the per-client cap does not apply to.
    exempt: tuple[str, ...] = ()


def connection_cap(requested: int | None) -> tuple[int, str | None]:
    """The most connections one API process may hold, and a warning for whoever runs the server when a
    `requested` value (SHARDCTL_MAX_CONNECTIONS) had to be lowered. `requested` None means
    `DEFAULT_MAX_CONNECTIONS`. Either is lowered to the soft open-file limit (`ulimit -n`, inherited by
    the worker processes) less `FD_RESERVE`, or less half the limit when that is smaller; only a
    requested value is warned about."""
    wanted = DEFAULT_MAX_CONNECTIONS if requested is None else requested
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted, None
    allowed = max(1, soft - min(FD_RESERVE, soft // 2))
    if wanted <= allowed:
        return wanted, None
    warning = None if requested is None else (
        f"SHARDCTL_MAX_CONNECTIONS={requested} is more than the open-file limit ({soft}, ulimit -n) leaves:"
        f" each API process holds at most {allowed} connections; raise the limit (systemd LimitNOFILE=)"
        " to allow more")
    return allowed, warning


def limits_from(settings: Settings) -> tuple[ConnectionLimits, str | None]:
    """The bounds `settings` ask for (SHARDCTL_HEADER_TIMEOUT_S, SHARDCTL_MAX_CONNECTIONS,
    SHARDCTL_MAX_CONNECTIONS_PER_CLIENT, SHARDCTL_CONNECTION_CAP_EXEMPT), with `connection_cap`'s warning."""
    cap, warning = connection_cap(settings.max_connections)
    return ConnectionLimits(header_timeout_s=settings.header_timeout_s, max_connections=cap,
                            max_per_client=settings.max_connections_per_client,
                            exempt=tuple(settings.connection_cap_exempt)), warning


def _refusal(message: str) -> bytes:
    body = json.dumps({"error": {"code": "too_many_connections", "message": message, "fields": [],
                                 "details": {}}}, separators=(",", ":")).encode()
    return (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: "
            + str(len(body)).encode() + b"\r\nretry-after: 1\r\nconnection: close\r\n\r\n" + body)


TOO_MANY_FROM_CLIENT = _refusal("this address holds too many connections to the server; close idle ones"
                                " and retry")
TOO_MANY_IN_ALL = _refusal("the server holds as many connections as it may; retry shortly")


def _address(peername: Any) -> Address | None:
    """The client's IP address (an IPv4 one for an IPv4-mapped IPv6 peer); None for a Unix socket."""
    if not isinstance(peername, tuple) or not peername or not isinstance(peername[0], str):
        return None
    try:
        address = ipaddress.ip_address(peername[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


class _Guard:
    """The counts all connections of one server share. Used from the server's event loop only."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.exempt: tuple[Network, ...] = tuple(ipaddress.ip_network(n, strict=False) for n in limits.exempt)
        self.open = 0
        self.per_client: Counter[Address] = Counter()
        self._refused: Counter[str] = Counter()
        self._logged_at: dict[str, float] = {}

    def capped(self, address: Address) -> bool:
        """Whether the per-client cap applies to `address`."""
        return self.limits.max_per_client > 0 and not any(address in network for network in self.exempt)

    def refused(self, reason: str, address: Address | None) -> None:
        self._refused[reason] += 1
        now = time.monotonic()
        if now - self._logged_at.get(reason, -REFUSAL_LOG_S) >= REFUSAL_LOG_S:
            log.warning("refused %d connection(s) since the last such line: %s (the last from %s)",
                        self._refused[reason], reason, address)
            self._refused[reason] = 0
            self._logged_at[reason] = now


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header deadline and connection caps (the module's contract).
    Only subclasses made by `guarded_protocol`, which give each server its own `guard`, are served."""

    guard: ClassVar[_Guard]

    _head_timer: asyncio.TimerHandle | None = None
    _awaiting_head = True
    _admitted = False
    _counted_as: Address | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        guard, address = self.guard, _address(transport.get_extra_info("peername"))
        if guard.open >= guard.limits.max_connections:
            self._refuse(TOO_MANY_IN_ALL, "over SHARDCTL_MAX_CONNECTIONS", address)
            return
        counted = address if address is not None and guard.capped(address) else None
        if counted is not None and guard.per_client[counted] >= guard.limits.max_per_client:
            self._refuse(TOO_MANY_FROM_CLIENT, "over SHARDCTL_MAX_CONNECTIONS_PER_CLIENT", address)
            return
        guard.open += 1
        self._admitted = True
        if counted is not None:
            guard.per_client[counted] += 1
            self._counted_as = counted
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._release()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._awaiting_head:  # bytes that start no request (blank lines) are timed too
            self._arm()
        super().data_received(data)

    def on_message_begin(self) -> None:
        self._awaiting_head = True
        self._arm()
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._awaiting_head = False
        self._disarm()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._awaiting_head = True  # the next bytes start the next request

    def handle_websocket_upgrade(self) -> None:
        # The WebSocket protocol takes the transport over, and with it the call to connection_lost.
        self._disarm()
        self._release()
        super().handle_websocket_upgrade()

    def _refuse(self, response: bytes, reason: str, address: Address | None) -> None:
        self.guard.refused(reason, address)
        self.transport.write(response)
        self.transport.close()

    def _arm(self) -> None:
        if self._head_timer is None:
            self._head_timer = asyncio.get_running_loop().call_later(self.guard.limits.header_timeout_s,
                                                                     self._head_timed_out)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def _release(self) -> None:
        if self._admitted:
            self._admitted = False
            self.guard.open -= 1
        if self._counted_as is not None:
            self.guard.per_client[self._counted_as] -= 1
            if self.guard.per_client[self._counted_as] <= 0:
                del self.guard.per_client[self._counted_as]
            self._counted_as = None


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedHttpToolsProtocol]:
    """The protocol class to give one uvicorn server (`uvicorn.Config(http=...)`): a subclass of
    `GuardedHttpToolsProtocol` with counts of its own, so call it once per server."""
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), {"guard": _Guard(limits)})
