"""Counting what a request costs the database: token lookups and connection checkouts."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event

from service.api import deps
from tests.db_fixtures import Env


@contextmanager
def counted(env: Env, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """While open: `lookups`, the tokens looked up (every lookup goes through `deps.authenticate`), and
    `checkouts`, the connections taken from the app's pool."""
    counts = {"lookups": 0, "checkouts": 0}
    real = deps.authenticate

    def lookup(conn: Any, secret: str, **kw: Any) -> Any:
        counts["lookups"] += 1
        return real(conn, secret, **kw)

    def checkout(*_: Any) -> None:
        counts["checkouts"] += 1

    monkeypatch.setattr(deps, "authenticate", lookup)
    engine = env.app.state.engine
    event.listen(engine, "checkout", checkout)
    try:
        yield counts
    finally:
        event.remove(engine, "checkout", checkout)
        monkeypatch.setattr(deps, "authenticate", real)
