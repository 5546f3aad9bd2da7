"""Which webhook URLs may be delivered to: http(s) only, and, unless an operator allows it
(`SHARDCTL_WEBHOOK_ALLOW_PRIVATE=1`), never an address on loopback, a private network, link-local
(cloud metadata services live there) or otherwise not globally routable, so that a tenant cannot
make the dispatcher reach what only it can reach."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from urllib.parse import urlsplit

MAX_URL_LENGTH = 2048
FIX_PRIVATE = ("use a public address, or, on a single-machine install, let the operator set"
               " SHARDCTL_WEBHOOK_ALLOW_PRIVATE=1")


class AddressRefused(ValueError):
    """A webhook URL that may not be used; the message says why and what to do instead."""


#: Ranges this Python's `is_global` may still call global but that are no public host: the IETF protocol
#: assignments (192.0.0.0/24, RFC 6890) and the NAT64 prefixes, whose IPv4 part is checked instead.
_NOT_GLOBAL = (ipaddress.ip_network("192.0.0.0/24"),)
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))


def _embedded(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries and leads to: mapped, 6to4, Teredo's client, NAT64."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    if any(ip in net for net in _NAT64):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def _refused_ip(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    if isinstance(ip, ipaddress.IPv6Address) and (inner := _embedded(ip)) is not None:
        return _refused_ip(inner)
    if any(ip in net for net in _NOT_GLOBAL):
        return "not globally routable"
    for test, what in ((ip.is_loopback, "loopback"), (ip.is_link_local, "link-local"),
                       (ip.is_private, "private"), (ip.is_multicast, "multicast"),
                       (ip.is_unspecified, "unspecified"), (ip.is_reserved, "reserved")):
        if test:
            return what
    return None if ip.is_global else "not globally routable"


def resolve(host: str, port: int) -> list[str]:
    """The addresses `host` resolves to, in the resolver's order of preference (an IP literal resolves
    to itself), each once; [] when it does not resolve."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def check_url(url: str, *, allow_private: bool) -> str:
    """`url` when a delivery may go there; `AddressRefused` otherwise. The host is resolved: a name
    that points at a private address is refused like the address itself (checked again before each
    delivery, `check_address`)."""
    if len(url) > MAX_URL_LENGTH:
        raise AddressRefused(f"the URL is {len(url)} characters long; at most {MAX_URL_LENGTH}")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise AddressRefused(f"not a URL ({exc}); send e.g. https://hooks.example.com/shardctl") from exc
    if parts.scheme not in ("http", "https"):
        raise AddressRefused(f"scheme {parts.scheme or '(none)'!r} is not allowed: send an http:// or https:// URL")
    if not parts.hostname:
        raise AddressRefused("the URL has no host: send e.g. https://hooks.example.com/shardctl")
    if parts.username or parts.password:
        raise AddressRefused("credentials in the URL are not allowed (they would be shown to every reader"
                             " of the subscription): authenticate deliveries by their signature instead")
    if port == 0:
        raise AddressRefused("port 0 is no port a server listens on: leave the port out, or name the real one")
    check_address(parts.hostname, port or (443 if parts.scheme == "https" else 80), allow_private=allow_private)
    return url


class Unresolved(AddressRefused):
    """The host does not resolve now: refused at subscription, but a delivery retries (DNS outages pass)."""


def check_address(host: str, port: int, *, allow_private: bool) -> list[str]:
    """The addresses `host` resolves to, each allowed; `AddressRefused` when one is not, `Unresolved`
    (a kind of it) when it does not resolve. With `allow_private` nothing is checked and [] returned
    (the HTTP client resolves the name itself). A delivery connects to the first address returned
    (`pinned`), never to a second resolution of the name that could point elsewhere (DNS rebinding)."""
    if allow_private:
        return []
    addresses = resolve(host, port)
    if not addresses:
        raise Unresolved(f"host {host!r} does not resolve; check the name")
    for address in addresses:
        why = _refused_ip(ipaddress.ip_address(address.split("%", 1)[0]))
        if why is not None:
            shown = host if host == address else f"{host} ({address})"
            raise AddressRefused(f"{shown} is a {why} address, refused by default: {FIX_PRIVATE}")
    return addresses


def pinned(url: str, address: str) -> tuple[str, dict[str, str], dict[str, str]]:
    """(url, headers, extensions) that send a request for `url` to `address` (a checked IP of its
    host): the URL names the address, `Host` keeps the name (IDNA-encoded), and for https the TLS
    server name (`sni_hostname`, which the certificate is also verified against) keeps it too."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    with contextlib.suppress(UnicodeError):  # Host and the TLS name travel as ASCII: a Unicode name as IDNA
        host = host.encode("idna").decode("ascii")
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    literal = f"[{address}]" if ip.version == 6 else address
    netloc = literal if parts.port is None else f"{literal}:{parts.port}"
    shown_host = f"[{host}]" if ":" in host else host
    headers = {"Host": shown_host if parts.port is None else f"{shown_host}:{parts.port}"}
    extensions = {"sni_hostname": host} if parts.scheme == "https" else {}
    return parts._replace(netloc=netloc).geturl(), headers, extensions
