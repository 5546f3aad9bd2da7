"""What the request gate hands a route's shortcut, and what a shortcut answers (`RequestGate` in
`service.api.app`; the shortcuts themselves live beside their routes)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from starlette.responses import Response

from service.store.tokens import Principal


@dataclass(frozen=True, slots=True)
class ShortcutRequest:
    """A request as a shortcut sees it: the path's parameters (as the route's template matched them),
    the raw query string, the bearer secret, the headers (Starlette's: names in any case, `get` gives
    the first of a repeated one, as FastAPI's `Header()` does), and the JSON body the gate parsed and
    found storable (None for a route without a body)."""

    path_params: dict[str, str]
    query: bytes
    secret: str
    headers: Mapping[str, str]
    body: Any = None


ShortcutTaken = tuple[Principal | None, Response | None]
"""What a shortcut did: (None, None) the token is unknown, revoked or expired (the gate answers 401);
(principal, answer) it answered; (principal, None) it declined after finding the principal."""

Shortcut = Callable[[FastAPI, ShortcutRequest], Awaitable[ShortcutTaken | None]]
"""Returns None to decline before looking the token up. It must store and answer exactly what its
route would, and answer nothing the route would refuse."""
