"""Forwarded identity: a user and groups named by an authenticating proxy (oauth2-proxy...) in front of the API.

Contract (docs/server.md, "Forwarded identity"; docs/security.md):

- Off unless `settings.forwarded_auth`; off, the headers are never read.
- On, they are read only from a request whose TCP peer is in `settings.forwarded_trusted_proxies`
  (`scope["client"]`: `shardctl serve` runs uvicorn without proxy-header rewriting, so this is the
  proxy's own address). From anyone else they are ignored, as if absent.
- A shardctl bearer token (`shc_...`) always wins: the forwarded headers are not consulted for a
  request that carries one. Any other `Authorization` value (a proxy passing its own ID token on)
  leaves the forwarded identity in charge.
- Groups map to roles: a group in `forwarded_admin_groups` makes the user an admin; otherwise a group
  in `forwarded_team_groups` makes them a member of that team (created on first use). A user whose
  groups map to several teams names one with `X-Shardctl-Team`; a user in no mapped group is a 403.
- The principal's id is `user:<name>`: events, the access log and per-token limits name the user.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

from sqlalchemy.orm import Session, sessionmaker

from service.settings import Settings
from service.store.tokens import TOKEN_PREFIX, Principal, ensure_team
from service.store.vocab import Role

#: The header a forwarded user whose groups map to several teams sends to pick one.
TEAM_HEADER = "X-Shardctl-Team"
#: What a forwarded user name may hold: printable, no spaces or separators that would confuse an actor string.
USER_NAME = re.compile(r"[A-Za-z0-9._@+-]{1,200}")
ID_PREFIX = "user:"


class ForwardedRefused(Exception):
    """The proxy named a user that may not act here: `status` (400 malformed, 403 no mapped group) and why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@dataclass(frozen=True, slots=True)
class Forwarded:
    """What the proxy said: the user and their groups."""

    user: str
    groups: tuple[str, ...]


@lru_cache(maxsize=32)
def _networks(trusted: tuple[str, ...]) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    return tuple(ipaddress.ip_network(item, strict=False) for item in trusted)


def trusted_peer(settings: Settings, client_host: str | None) -> bool:
    """True when forwarded identity is on and `client_host` (the TCP peer) is a configured trusted proxy."""
    if not settings.forwarded_auth or not client_host:
        return False
    try:
        address = ipaddress.ip_address(client_host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in network for network in _networks(tuple(settings.forwarded_trusted_proxies)))


def is_shardctl_token(bearer: str | None) -> bool:
    return bearer is not None and bearer.startswith(f"{TOKEN_PREFIX}_")


def _once(headers: Mapping[str, str], name: str) -> str:
    """The value of header `name` ("" when absent); `ForwardedRefused` (400) when it came more than once:
    which copy a proxy meant (the one it set, or one the client sent that it passed on) cannot be told."""
    getlist = getattr(headers, "getlist", None)  # Starlette's headers keep every copy
    values = getlist(name) if getlist is not None else [headers.get(name) or ""]
    if len(values) > 1:
        raise ForwardedRefused(400, f"the {name} header came {len(values)} times; an authenticating proxy sends it"
                               " once (configure it to replace the client's copy, not to add its own)")
    return str(values[0]) if values else ""


def read_forwarded(settings: Settings, headers: Mapping[str, str], client_host: str | None) -> Forwarded | None:
    """The proxy's user and groups, or None when forwarded identity is off, the peer is not trusted, or
    the user header is absent. Raises `ForwardedRefused` (400) for a malformed user name, or a user or
    groups header that came more than once."""
    if not trusted_peer(settings, client_host):
        return None
    user = _once(headers, settings.forwarded_user_header).strip()
    if not user:
        return None
    if USER_NAME.fullmatch(user) is None:
        raise ForwardedRefused(400, f"the {settings.forwarded_user_header} header is not a user name (1 to 200 of"
                               " letters, digits and ._@+-)")
    raw = _once(headers, settings.forwarded_groups_header)
    groups = tuple(g for g in (part.strip() for part in raw.split(",")) if g)
    return Forwarded(user=user, groups=groups)


def forwarded_principal(settings: Settings, sessions: sessionmaker[Session], who: Forwarded,
                        chosen_team: str | None) -> Principal:
    """The principal `who` acts as (see the module's contract). Raises `ForwardedRefused` (403) when no
    group maps, or the team must be chosen, or the chosen team is not one of theirs."""
    token_id = f"{ID_PREFIX}{who.user}"
    if set(who.groups) & set(settings.forwarded_admin_groups):
        return Principal(token_id=token_id, role=Role.ADMIN)
    teams = sorted({settings.forwarded_team_groups[g] for g in who.groups if g in settings.forwarded_team_groups})
    if not teams:
        raise ForwardedRefused(403, f"user {who.user!r} is in no group mapped to a team or to admin"
                               " (SHARDCTL_FORWARDED_TEAM_GROUPS, SHARDCTL_FORWARDED_ADMIN_GROUPS)")
    if chosen_team:
        if chosen_team not in teams:
            raise ForwardedRefused(403, f"{TEAM_HEADER}: user {who.user!r} is not in team {chosen_team!r}; their"
                                   f" groups map to {', '.join(teams)}")
        team_name = chosen_team
    elif len(teams) == 1:
        team_name = teams[0]
    else:
        raise ForwardedRefused(403, f"user {who.user!r} is in several teams ({', '.join(teams)}): send"
                               f" {TEAM_HEADER} with the one to act for")
    with sessions.begin() as session:
        team = ensure_team(session, team_name)
        team_id = team.id
    return Principal(token_id=token_id, role=Role.MEMBER, team_id=team_id, team_name=team_name)
