"""What the request gate hands a route's shortcut, and what a shortcut answers (`RequestGate` in
`service.api.app`; the shortcuts themselves live beside their routes)."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, TypeVarTuple

import anyio.to_thread
from anyio import CapacityLimiter
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

T = TypeVar("T")
Args = TypeVarTuple("Args")

Shortcut = Callable[[FastAPI, ShortcutRequest], Awaitable[ShortcutTaken | None]]
"""Returns None to decline before looking the token up. It must store and answer exactly what its
route would, and answer nothing the route would refuse."""


class ShortcutThreads:
    """How many shortcuts work at once on each event loop serving the app: at most `threads` reads
    and heartbeats (`run`) and as many submissions (`run_submission`); the others wait their turn in
    the order they came (anyio's `CapacityLimiter`). `Settings.shortcut_threads`; why, see `run`.

    Submissions have their own: one may wait seconds for a planning thread (`PlanRunner`), and reads
    and heartbeats must not queue behind it. One pair per event loop: an API process serves on one,
    but a test may serve one app from two, and a limiter is not safe to share between loops."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[CapacityLimiter, CapacityLimiter]] \
            = weakref.WeakKeyDictionary()

    def _limiters(self) -> tuple[CapacityLimiter, CapacityLimiter]:
        loop = asyncio.get_running_loop()
        limiters = self._by_loop.get(loop)
        if limiters is None:
            limiters = self._by_loop.setdefault(loop, (CapacityLimiter(self.threads), CapacityLimiter(self.threads)))
        return limiters

    async def run(self, work: Callable[[*Args], T], *args: *Args) -> T:
        """`work(*args)` on a handler thread once one of the reads' and heartbeats' places is free.
        With a thread each (anyio's default limit is 40), 16 clients' requests took turns on each
        process's GIL: with three at once, the 2-core machine served 7 to 25 % more requests a second
        and the loaded p99 of reads fell by a quarter to a half (`benchmarks/api_load.py`,
        benchmarks/results/api_load.md)."""
        return await anyio.to_thread.run_sync(work, *args, limiter=self._limiters()[0])

    async def run_submission(self, work: Callable[[*Args], T], *args: *Args) -> T:
        """`work(*args)` on a handler thread once one of the submissions' places is free."""
        return await anyio.to_thread.run_sync(work, *args, limiter=self._limiters()[1])
