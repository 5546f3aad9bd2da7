"""The query string of an API route holds only the parameters it takes, each single-valued one once.

FastAPI ignores a query parameter a route does not take, and reads `?type=a&type=b`, for a parameter
that takes one value, as `type=b`. Either way the request succeeds as if part of it had not been
written: `GET /v1/jobs?stauts=FAILED` lists every job. Every route depends on `checked_query` (the
app's own dependency), which answers such a request with the 422 of an invalid parameter, naming it
and what the route takes. Unknown parameters are refused on the JSON API (`/v1/...`) only: the
dashboard's pages and the probes keep the browser's and the monitors' leeway. Parameters that take a
list (`status` of `GET /v1/jobs`) are repeated on purpose and are left alone.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any, Union, get_args, get_origin

from fastapi import Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError

API_PREFIX = "/v1/"
_SEQUENCES = (list, set, frozenset, tuple)


@dataclass(frozen=True, slots=True)
class _Taken:
    """The query keys (aliases) a route takes, and those of them that take one value."""

    known: frozenset[str]
    single: frozenset[str]
    strict: bool  # unknown keys are refused


def _takes_several(annotation: Any) -> bool:
    """Whether a parameter of this type reads every value of a repeated key (`list[X] | None` ...)."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        return any(_takes_several(arg) for arg in get_args(annotation))
    return origin in _SEQUENCES or annotation in _SEQUENCES


def _taken(dependant: Dependant, path: str) -> _Taken:
    known: set[str] = set()
    single: set[str] = set()
    pending = [dependant]
    while pending:
        current = pending.pop()
        for field in current.query_params:
            known.add(field.alias)
            if not _takes_several(field.field_info.annotation):
                single.add(field.alias)
        pending.extend(current.dependencies)
    return _Taken(frozenset(known), frozenset(single), path.startswith(API_PREFIX))


def _refuse(key: str, message: str, values: list[str]) -> RequestValidationError:
    return RequestValidationError([{"type": "value_error", "loc": ("query", key), "input": values, "msg": message}])


async def checked_query(request: Request) -> None:
    """Raise the 422 of an invalid parameter for a query parameter an API route does not take, or one
    that takes one value given more than once. Per route, its parameters are found once and kept in
    `app.state.checked_query` where the app has that dict (routes live as long as their app, so their
    ids stay theirs). A coroutine, so that it costs no thread hop: it only reads the request."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None or not request.scope.get("query_string"):
        return
    cache: dict[int, _Taken] = getattr(request.app.state, "checked_query", {})
    taken = cache.get(id(route))
    if taken is None:
        taken = cache[id(route)] = _taken(dependant, getattr(route, "path", ""))
    query = request.query_params
    seen: set[str] = set()
    for key, _ in query.multi_items():
        if key not in taken.known:
            if taken.strict:
                takes = f"it takes {', '.join(sorted(taken.known))}" if taken.known else "it takes none"
                raise _refuse(key, f"{key!r} is not a query parameter of this route; {takes}", query.getlist(key))
        elif key in taken.single:
            if key in seen:
                raise _refuse(key, f"{key} is given {len(query.getlist(key))} times; it takes one value",
                              query.getlist(key))
            seen.add(key)
