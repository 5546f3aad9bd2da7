"""The backend's one way to the API server: `kubernetes.dynamic.DynamicClient`, wire JSON in and out,
the backend error vocabulary out.

Every kind (ConfigMap, Secret, Service, Pod, Job, JobSet, PyTorchJob) takes the same code path:
`resources.get(api_version=..., kind=...)` (API discovery: `GET /version`, `/apis`, then
`/api/v1` or `/apis/<group>/<version>` the first time a group is needed), then `create`, `get`,
`delete` or `patch` on that resource with a namespace and, for lists, a label selector. A kind the
cluster does not serve is one that discovery does not list (`serves()` says False).

A group version that does not answer is an outage (`BackendUnavailable`), never "not served".
Discovery results live in this process only (DynamicClient's default cache file in /tmp would
outlive a cluster that gains or loses a CRD, and would be shared by every process on the host).

Errors (`base`'s vocabulary):

- no answer (connection refused, a timeout, a broken connection), 502/503/504, or 401 (our
  credentials; nothing a job could change): `BackendUnavailable`;
- answered, try later: 429, 500 and other 5xx, 409 Conflict, 403 "exceeded quota":
  `TransientBackendError` (409 AlreadyExists on a create: its subclass `AlreadyExists`);
- refused for good: any other 4xx (400, 403, 404 on a create, 422 Invalid): `SubmissionRefused`,
  except during discovery, which is about this backend and never a job: `BackendUnavailable`.

`get` and `delete` answer a 404 as None / False rather than raising.
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypedDict, TypeVar

import msgspec
import urllib3
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient, LazyDiscoverer
from kubernetes.dynamic.exceptions import ResourceNotFoundError

from workers.backends.base import BackendError, BackendUnavailable, SubmissionRefused, TransientBackendError
from workers.backends.kubernetes.naming import ApiType

DELETE_FOREGROUND = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Foreground"}
MERGE_PATCH = "application/merge-patch+json"


_Item = TypeVar("_Item")


class _ItemsOf(TypedDict, Generic[_Item], total=False):
    """A list answer (`PodList`, `JobSetList`...) as a shaped `list` decodes it: only its items."""

    items: list[_Item] | None


class AlreadyExists(TransientBackendError):
    """A create answered 409 AlreadyExists: a previous try (or someone else) made an object of that name."""


def _wire(_client: Any, data: Any) -> Any:
    """DynamicClient serializer: keep the response exactly as the server sent it (plain JSON)."""
    return data


def _status_of(exc: ApiException) -> tuple[int, str, str]:
    status, reason, message = int(exc.status or 0), str(exc.reason or ""), ""
    try:
        body = json.loads(exc.body) if exc.body else {}
        reason = str(body.get("reason") or reason)
        message = str(body.get("message") or "")
    except (ValueError, AttributeError):
        message = str(exc.body or "")
    return status, reason, message


def api_error(exc: ApiException, what: str, *, discovery: bool = False) -> BackendError:
    """The backend error for an API answer that is not a success (see the module docstring). A refusal
    of discovery is about this backend (its RBAC, its server), never a job: `BackendUnavailable`."""
    status, reason, message = _status_of(exc)
    text = f"{what}: {status} {reason}" + (f": {message}" if message else "")
    if status == 0 or status in (502, 503, 504):
        return BackendUnavailable(f"Kubernetes API did not answer: {text}")
    if status == 401:
        return BackendUnavailable(f"Kubernetes API does not accept this backend's credentials: {text}")
    if status == 409 and reason == "AlreadyExists":
        return AlreadyExists(text)
    if status in (409, 429) or status >= 500 or (status == 403 and "exceeded quota" in message):
        return TransientBackendError(text)
    if discovery:
        return BackendUnavailable(f"Kubernetes API discovery refused: {text}")
    return SubmissionRefused(text)


class _InMemoryDiscoverer(LazyDiscoverer):
    """LazyDiscoverer that never reads or writes a cache file: discovery lives as long as the client."""

    def __init__(self, client: Any, cache_file: str | None) -> None:
        # A path that never exists: the discoverer starts empty and asks the server.
        missing = os.path.join(tempfile.gettempdir(), f"shardctl-k8s-discovery-{uuid.uuid4().hex}", "none.json")
        super().__init__(client, missing)  # type: ignore[no-untyped-call]

    def _write_cache(self) -> None:
        return None


class _Dynamic(DynamicClient):
    """DynamicClient whose every request, discovery included, has the backend's timeout."""

    def __init__(self, api_client: Any, timeout: float) -> None:
        self._timeout = timeout
        super().__init__(api_client, discoverer=_InMemoryDiscoverer)  # type: ignore[no-untyped-call]

    def request(self, method: str, path: str, body: Any = None, **params: Any) -> Any:
        params.setdefault("_request_timeout", self._timeout)
        return super().request(method, path, body=body, **params)


class KubeClient:
    """Namespaced objects of any served kind, through one DynamicClient made on first use (so making
    a backend, or rendering, never contacts the cluster)."""

    def __init__(self, api_client: Any, request_timeout: float) -> None:
        self.api_client = api_client
        self.timeout = request_timeout
        self._client: _Dynamic | None = None
        self._resources: dict[ApiType, Any] = {}
        self._decoders: dict[type, msgspec.json.Decoder[Any]] = {}

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, missing_ok: bool = False,
              discovery: bool = False, **kwargs: Any) -> Any:
        """`fn(*args, **kwargs)` with its failures in the backend's words; None for a 404 if `missing_ok`."""
        try:
            return fn(*args, **kwargs)
        except ApiException as exc:
            if missing_ok and exc.status == 404:
                return None
            raise api_error(exc, what, discovery=discovery) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise BackendUnavailable(f"Kubernetes API unreachable ({what}): {exc}") from exc

    def _dynamic(self) -> _Dynamic:
        if self._client is None:
            try:
                self._client = self._call("API discovery", _Dynamic, self.api_client, self.timeout, discovery=True)
            except ValueError as exc:  # DynamicClient's words for a broken connection during discovery
                raise BackendUnavailable(f"Kubernetes API discovery failed: {exc}") from exc
        return self._client

    # -- discovery ---------------------------------------------------------------------------
    def resource(self, api: ApiType) -> Any | None:
        """The discovered resource for `api`, or None when the cluster does not serve it."""
        if api not in self._resources:
            client = self._dynamic()
            try:
                found = self._call(f"discovery of {api.kind}", client.resources.get, discovery=True,
                                   prefix="api" if api.core else "apis", api_version=api.api_version, kind=api.kind)
            except ResourceNotFoundError:
                self._confirm_not_served(client, api)
                found = None
            except ValueError as exc:
                raise BackendUnavailable(f"Kubernetes API discovery failed: {exc}") from exc
            self._resources[api] = found
        return self._resources[api]

    def _confirm_not_served(self, client: _Dynamic, api: ApiType) -> None:
        """DynamicClient reads a group version that answers 503 as one with no resources: ask it once
        more, so that an outage is never remembered as "the cluster does not serve this kind"."""
        path = "/api/v1" if api.core else f"/apis/{api.api_version}"
        listing = self._call(f"discovery of {api.kind}", client.request, "get", path, serializer=_wire,
                             missing_ok=True, discovery=True)
        kinds = {r.get("kind") for r in (listing or {}).get("resources") or [] if "/" not in str(r.get("name"))}
        if api.kind in kinds:
            raise TransientBackendError(f"discovery of {api.kind}: {path} lists it now; try again")

    def serves(self, api: ApiType) -> bool:
        return self.resource(api) is not None

    # -- objects (of a kind the cluster does not serve, none exist: get None, list [], delete False) --------
    def _json(self, out: Any, what: str) -> dict[str, Any]:
        if not isinstance(out, dict):
            raise BackendUnavailable(f"Kubernetes API answered {what} with {type(out).__name__}, not an object")
        return out

    def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Create `obj` in its namespace; the stored object. `AlreadyExists` when the name is taken."""
        api = ApiType(obj["apiVersion"], obj["kind"])
        what = f"create {api.kind} {obj['metadata']['name']}"
        resource = self.resource(api)
        if resource is None:
            raise SubmissionRefused(f"{what}: the cluster does not serve {api.kind} ({api.api_version}), "
                                    "by API discovery")
        out = self._call(what, self._dynamic().create, resource, body=dict(obj),
                         namespace=obj["metadata"]["namespace"], serializer=_wire)
        return self._json(out, what)

    def get(self, api: ApiType, ns: str, name: str) -> dict[str, Any] | None:
        what = f"get {api.kind} {ns}/{name}"
        resource = self.resource(api)
        if resource is None:
            return None
        out = self._call(what, self._dynamic().get, resource, name=name, namespace=ns, serializer=_wire,
                         missing_ok=True)
        return None if out is None else self._json(out, what)

    def list(self, api: ApiType, ns: str, selector: str, *, shape: type | None = None) -> list[dict[str, Any]]:
        """The objects of kind `api` in `ns` that match the label `selector`, as the server sent them.

        With `shape` (a `TypedDict`, `total=False`, whose nested dicts are `TypedDict`s too), each item
        holds only the fields `shape` names, where the server sent them, with the values it sent: msgspec
        decodes those and skips the rest of the JSON without building it (for thousands of pods, decoding
        whole objects is most of a poll's CPU). An answer that does not fit `shape` (a field of another
        JSON type than declared) is decoded whole, as without `shape`."""
        what = f"list {api.kind} in {ns}"
        resource = self.resource(api)
        if resource is None:
            return []
        if shape is None:
            out = self._call(what, self._dynamic().get, resource, namespace=ns, label_selector=selector,
                             serializer=_wire)
            return list(self._json(out, what).get("items") or [])
        response = self._call(what, self._dynamic().get, resource, namespace=ns, label_selector=selector,
                              serialize=False)
        data: bytes = response.data
        decoder = self._decoders.get(shape)
        if decoder is None:
            decoder = self._decoders[shape] = msgspec.json.Decoder(_ItemsOf[shape])  # type: ignore[valid-type]
        try:
            shaped: dict[str, Any] = decoder.decode(data)
        except msgspec.DecodeError:  # not JSON, or not of `shape`: as DynamicClient would have answered it
            try:
                out = json.loads(data.decode("utf8"))
            except ValueError:
                out = data.decode("utf8")
            return list(self._json(out, what).get("items") or [])
        return list(shaped.get("items") or [])

    def delete(self, api: ApiType, ns: str, name: str, *, grace_period_s: int | None = None) -> bool:
        """Delete with foreground propagation (and `gracePeriodSeconds` when given: the pods get SIGTERM and
        that long before SIGKILL); False if it was already gone."""
        resource = self.resource(api)
        if resource is None:
            return False
        body = DELETE_FOREGROUND if grace_period_s is None else {**DELETE_FOREGROUND,
                                                                 "gracePeriodSeconds": grace_period_s}
        out = self._call(f"delete {api.kind} {ns}/{name}", self._dynamic().delete, resource, name=name,
                         namespace=ns, body=body, serializer=_wire, missing_ok=True)
        return out is not None

    def merge_patch(self, api: ApiType, ns: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        what = f"patch {api.kind} {ns}/{name}"
        resource = self.resource(api)
        if resource is None:
            raise SubmissionRefused(f"{what}: the cluster does not serve {api.kind} ({api.api_version})")
        out = self._call(what, self._dynamic().patch, resource, body=dict(patch), name=name, namespace=ns,
                         content_type=MERGE_PATCH, serializer=_wire)
        return self._json(out, what)

    def pod_log(self, ns: str, name: str, query: Mapping[str, str]) -> str | None:
        """`GET /api/v1/namespaces/{ns}/pods/{name}/log` with `query` (container, timestamps, sinceTime,
        limitBytes...): the text, or None for a pod that is gone (404) or has nothing to show yet (400:
        its container is still waiting to start)."""
        what = f"log of pod {ns}/{name}"
        try:
            response = self._dynamic().request("get", f"/api/v1/namespaces/{ns}/pods/{name}/log",
                                               query_params=list(query.items()), header_params={"Accept": "*/*"},
                                               serialize=False)
        except ApiException as exc:
            if exc.status in (400, 404):
                return None
            raise api_error(exc, what) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise BackendUnavailable(f"Kubernetes API unreachable ({what}): {exc}") from exc
        data = response.data if hasattr(response, "data") else response
        return data.decode(errors="replace") if isinstance(data, bytes) else str(data)
