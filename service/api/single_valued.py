"""A query parameter that takes one value refuses being given twice.

FastAPI reads `?type=a&type=b`, for a parameter that takes one value, as `type=b`, and the request
succeeds as if `type=a` had never been written: a client that built its URL wrong gets an answer to
another question. Every route depends on `single_valued_query` (the app's own dependency), which
answers such a request with the 422 of any invalid parameter, naming it. Parameters that take a
list (`status` of `GET /v1/jobs`) are repeated on purpose and are left alone.
"""

from __future__ import annotations

import types
from typing import Any, Union, get_args, get_origin

from fastapi import Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError

_SEQUENCES = (list, set, frozenset, tuple)


def _takes_several(annotation: Any) -> bool:
    """Whether a parameter of this type reads every value of a repeated key (`list[X] | None` ...)."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        return any(_takes_several(arg) for arg in get_args(annotation))
    return origin in _SEQUENCES or annotation in _SEQUENCES


def _single_valued_names(dependant: Dependant) -> frozenset[str]:
    """The query keys (aliases) of `dependant` and its sub-dependencies that take one value."""
    names: set[str] = set()
    pending = [dependant]
    while pending:
        current = pending.pop()
        names.update(f.alias for f in current.query_params if not _takes_several(f.field_info.annotation))
        pending.extend(current.dependencies)
    return frozenset(names)


def single_valued_query(request: Request) -> None:
    """Raise the 422 of an invalid parameter when a query parameter that takes one value is given more
    than once. Per route, the parameters are found once and kept in `app.state.single_valued_query`
    where the app has that dict (routes live as long as their app, so their ids stay theirs)."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None or not request.scope.get("query_string"):
        return
    known: dict[int, frozenset[str]] = getattr(request.app.state, "single_valued_query", {})
    names = known.get(id(route))
    if names is None:
        names = known[id(route)] = _single_valued_names(dependant)
    seen: set[str] = set()
    for key, _ in request.query_params.multi_items():
        if key in names:
            if key in seen:
                raise RequestValidationError([{
                    "type": "value_error", "loc": ("query", key), "input": request.query_params.getlist(key),
                    "msg": f"{key} is given {len(request.query_params.getlist(key))} times; it takes one value"}])
            seen.add(key)
