"""RBAC as the API server applies it, for the chart's tests: requests to (verb, group, resource,
namespace), the question whether a Role's rules allow one, and the rules a rendered chart binds to its
ServiceAccount in each namespace (`roles_by_namespace`).

`authorization(method, path, query)` maps a request the fake API server recorded to what the real
API server's authorizer asks: GET of a named object is `get`, of a collection `list` (`watch` with
`?watch=true`), POST `create`, PATCH `patch`, PUT `update`, DELETE `delete` (`deletecollection`
without a name); `pods/<name>/log` is the subresource `pods/log`. Discovery (`/version`, `/api`,
`/apis`, and group versions) is a non-resource URL every authenticated client may read (the
built-in `system:discovery` ClusterRole), so it returns None.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tests.deploy.chart import find

_RESOURCE = re.compile(r"^/(?:api/(?P<cv>v1)|apis/(?P<g>[^/]+)/(?P<v>[^/]+))(?:/namespaces/(?P<ns>[^/]+))?"
                       r"/(?P<plural>[^/]+)(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?$")
_DISCOVERY = re.compile(r"^/(version|api|api/v1|apis|apis/[^/]+/[^/]+)/?$")


@dataclass(frozen=True)
class Access:
    """One authorization check: verb on group/resource (with `/subresource`) in namespace (None: cluster)."""

    verb: str
    group: str
    resource: str
    namespace: str | None


def authorization(method: str, path: str, query: dict[str, list[str]]) -> Access | None:
    """What the authorizer checks for this request; None for discovery. Raises ValueError for a path
    it cannot classify (so an unexpected request fails the test instead of passing unchecked)."""
    if method == "GET" and _DISCOVERY.match(path):
        return None
    m = _RESOURCE.match(path)
    if m is None:
        raise ValueError(f"{method} {path}: not a resource path")
    group = "" if m["cv"] else m["g"]
    resource = m["plural"] + (f"/{m['sub']}" if m["sub"] else "")
    named = m["name"] is not None
    if method == "GET":
        verb = "get" if named else ("watch" if (query.get("watch") or ["false"])[0] == "true" else "list")
    elif method == "POST" and not named:
        verb = "create"
    elif method == "PATCH" and named:
        verb = "patch"
    elif method == "PUT" and named:
        verb = "update"
    elif method == "DELETE":
        verb = "delete" if named else "deletecollection"
    else:
        raise ValueError(f"{method} {path}: no RBAC verb")
    return Access(verb, group, resource, m["ns"])


def allows(rules: list[dict[str, Any]], access: Access) -> bool:
    """Whether any PolicyRule grants `access` (exact names only: the chart uses no wildcards)."""
    return any(access.group in r.get("apiGroups", []) and access.resource in r.get("resources", [])
               and access.verb in r.get("verbs", []) and not r.get("resourceNames") for r in rules)


def grants(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """Every (group, resource, verb) the rules grant."""
    return {(g, res, v) for r in rules for g in r.get("apiGroups", []) for res in r.get("resources", [])
            for v in r.get("verbs", [])}


def roles_by_namespace(objs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The rules bound to the chart's ServiceAccount in each namespace (Role or ClusterRole)."""
    sa = next(o for o in objs if o["kind"] == "ServiceAccount")["metadata"]["name"]
    out: dict[str, list[dict[str, Any]]] = {}
    for binding in find(objs, "RoleBinding"):
        assert any(s["kind"] == "ServiceAccount" and s["name"] == sa for s in binding["subjects"])
        ref = binding["roleRef"]
        role = next(o for o in objs if o["kind"] == ref["kind"] and o["metadata"]["name"] == ref["name"]
                    and (ref["kind"] == "ClusterRole" or o["metadata"]["namespace"] ==
                         binding["metadata"]["namespace"]))
        out[binding["metadata"]["namespace"]] = role["rules"]
    return out
