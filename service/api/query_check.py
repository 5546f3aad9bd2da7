"""The query string of an API route holds only the parameters it takes, each single-valued one once.

FastAPI ignores a query parameter a route does not take, and reads `?type=a&type=b`, for a parameter
that takes one value, as `type=b`. Either way the request succeeds as if part of it had not been
written: `GET /v1/jobs?stauts=FAILED` listed every job. The request gate (`RequestGate` in
`service.api.app`) refuses such a request with the 422 of an invalid parameter, naming it and what
the route takes, before any shortcut or route sees it. Unknown parameters are refused on the JSON API
(`/v1/...`) only: the dashboard's pages and the probes keep the browser's and the monitors' leeway.
Parameters that take a list (`status` of `GET /v1/jobs`) are repeated on purpose and are left alone.
"""

from __future__ import annotations

import types
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Union, get_args, get_origin

from starlette.datastructures import QueryParams

API_PREFIX = "/v1/"
_SEQUENCES = (list, set, frozenset, tuple)


@dataclass(frozen=True, slots=True)
class QueryKeys:
    """The query keys (aliases) a route takes, those of them that take one value, and whether a key
    it does not take is refused."""

    known: frozenset[str]
    single: frozenset[str]
    strict: bool


def _takes_several(annotation: Any) -> bool:
    """Whether a parameter of this type reads every value of a repeated key (`list[X] | None` ...)."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        return any(_takes_several(arg) for arg in get_args(annotation))
    return origin in _SEQUENCES or annotation in _SEQUENCES


def query_keys(fields: Iterable[Any], path: str) -> QueryKeys:
    """The `QueryKeys` of the route at `path` whose dependencies declare the query parameters `fields`
    (FastAPI's `Dependant.query_params`; each a plain parameter: no route takes a pydantic model of
    query parameters)."""
    fields = list(fields)
    return QueryKeys(frozenset(f.alias for f in fields),
                     frozenset(f.alias for f in fields if not _takes_several(f.field_info.annotation)),
                     path.startswith(API_PREFIX))


def query_problem(keys: QueryKeys, query_string: bytes) -> tuple[str, str] | None:
    """(the parameter's location, what is wrong) for the first parameter of `query_string` that the
    route does not take (where `keys.strict`) or that takes one value and comes again; else None."""
    if not query_string:
        return None
    query = QueryParams(query_string)
    seen: set[str] = set()
    for key, _ in query.multi_items():
        if key not in keys.known:
            if keys.strict:
                takes = f"it takes {', '.join(sorted(keys.known))}" if keys.known else "it takes none"
                return f"query.{key}", f"{key!r} is not a query parameter of this route; {takes}"
        elif key in keys.single:
            if key in seen:
                return f"query.{key}", f"{key} is given {len(query.getlist(key))} times; it takes one value"
            seen.add(key)
    return None
