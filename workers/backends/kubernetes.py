"""The Kubernetes backend: a JobSet (or Indexed Job + headless Service, or a Kubeflow PyTorchJob) per
attempt, through the official `kubernetes` client.

Contracts (see `docs/kubernetes.md` for the whole picture):

- `render(req)` is pure: the objects `submit` would create, secrets redacted (`k8s_objects`).
- `submit(req)` creates the ConfigMap (plan), the Secret (job token), the Service (Indexed Job only)
  and then the workload, all named `req.name`. An `AlreadyExists` (409) on any of them means a
  previous try got that far: the object is adopted, never recreated. The helper objects are then
  given an ownerReference to the workload, so Kubernetes garbage-collects them with it.
- `find(name)` looks the name up in each namespace this backend manages, for each served kind.
- `poll(handles)` makes one labelled list per (namespace, workload kind) plus one labelled pod list
  per namespace, whatever the number of jobs, and maps conditions and pod statuses to an
  `Observation` (state, failure class, exit code, nodes, log tail).
- `cancel(handle)` deletes with `propagationPolicy=Foreground`; 404 is success.
- `logs(handle, rank, follow)` streams the log of the pod with that node rank.
- A cluster that cannot be reached (connection refused, timeout, 5xx, 429) raises
  `BackendUnavailable`; a request the cluster refuses for good (422 Invalid, 403, a kind it does not
  serve, a namespace this backend does not manage) raises `SubmissionRejected`.

The `kubernetes` client is wrapped narrowly by `_Kube`: every call returns the wire JSON as a dict.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import urllib3
from kubernetes import client as k8s_client

from workers.backends.base import (
    BackendUnavailable,
    Capabilities,
    FailureClass,
    Handle,
    LaunchRequest,
    Observation,
    Rendered,
    RunState,
)
from workers.backends.k8s_objects import (
    API_VERSIONS,
    COMPLETION_INDEX,
    CONTAINER,
    LABEL_NAME,
    MANAGED_BY,
    MANAGER,
    OBJECT_KINDS,
    PYTORCH_CONTAINER,
    ObjectKind,
    RenderError,
    RenderOptions,
    k8s_name,
    namespace_for,
    render_objects,
)

log = logging.getLogger("shardctl.backends.kubernetes")

SELECTOR = f"{MANAGED_BY}={MANAGER}"
JOBSET_GROUP, JOBSET_VERSION, JOBSET_PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
KUBEFLOW_GROUP, KUBEFLOW_VERSION, PYTORCH_PLURAL = "kubeflow.org", "v1", "pytorchjobs"
RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
#: Pod disruption reasons (condition DisruptionTarget) that mean "preempted" rather than "node".
PREEMPTION_REASONS = {"PreemptionByScheduler", "PreemptionByKueue"}
NODE_POD_REASONS = {"Evicted", "NodeLost", "NodeShutdown", "Terminated", "UnexpectedAdmissionError"}
CANCELLED_MEMORY = 10_000
_EXIT_CODE = re.compile(r"exit code (\d+)")


class SubmissionRejected(ValueError):
    """The cluster (or this backend) refuses the request for good: retrying it unchanged cannot help."""


class _ApiError(Exception):
    """A definite answer from the API server that is not a success (404, 409, 422...)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


def _unavailable_status(status: int) -> bool:
    return status == 0 or status == 429 or status >= 500


class _Kube:
    """The narrow, typed wrapper over the untyped official client. Every method returns wire JSON.

    Raises `BackendUnavailable` for transport failures and 429/5xx, `_ApiError` for other statuses."""

    def __init__(self, api_client: Any, request_timeout: float) -> None:
        self.core: Any = k8s_client.CoreV1Api(api_client)
        self.batch: Any = k8s_client.BatchV1Api(api_client)
        self.custom: Any = k8s_client.CustomObjectsApi(api_client)
        self.apis: Any = k8s_client.ApisApi(api_client)
        self.timeout = request_timeout

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        resp = self._raw(fn, *args, **kwargs)
        try:
            data = resp.data
        finally:
            resp.release_conn()
        out = json.loads(data) if data else {}
        if not isinstance(out, dict):
            raise BackendUnavailable(f"the API server answered {type(out).__name__}, not an object")
        return out

    def _raw(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, _preload_content=False, _request_timeout=self.timeout, **kwargs)
        except k8s_client.ApiException as exc:
            status = int(exc.status or 0)
            reason, message = str(exc.reason or ""), ""
            try:
                body = json.loads(exc.body) if exc.body else {}
                reason = str(body.get("reason") or reason)
                message = str(body.get("message") or "")
            except (ValueError, AttributeError):
                message = str(exc.body or "")
            if _unavailable_status(status):
                raise BackendUnavailable(f"Kubernetes API answered {status} {reason}: {message}") from exc
            raise _ApiError(status, reason, message) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise BackendUnavailable(f"Kubernetes API unreachable: {exc}") from exc

    # -- discovery ---------------------------------------------------------------------------
    def served_groups(self) -> dict[str, set[str]]:
        data = self._call(self.apis.get_api_versions)
        return {g["name"]: {v["version"] for v in g.get("versions", [])} for g in data.get("groups", [])}

    def resources(self, group: str, version: str) -> set[str]:
        try:
            data = self._call(self.custom.get_api_resources, group, version)
        except _ApiError as exc:
            if exc.status == 404:
                return set()
            raise
        return {r["name"] for r in data.get("resources", [])}

    # -- objects by kind -----------------------------------------------------------------------
    def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        ns, kind = obj["metadata"]["namespace"], obj["kind"]
        body = dict(obj)
        if kind == "ConfigMap":
            return self._call(self.core.create_namespaced_config_map, ns, body)
        if kind == "Secret":
            return self._call(self.core.create_namespaced_secret, ns, body)
        if kind == "Service":
            return self._call(self.core.create_namespaced_service, ns, body)
        if kind == "Job":
            return self._call(self.batch.create_namespaced_job, ns, body)
        group, version, plural = _custom(kind)
        return self._call(self.custom.create_namespaced_custom_object, group, version, ns, plural, body)

    def get(self, kind: str, ns: str, name: str) -> dict[str, Any] | None:
        try:
            if kind == "ConfigMap":
                return self._call(self.core.read_namespaced_config_map, name, ns)
            if kind == "Secret":
                return self._call(self.core.read_namespaced_secret, name, ns)
            if kind == "Service":
                return self._call(self.core.read_namespaced_service, name, ns)
            if kind == "Job":
                return self._call(self.batch.read_namespaced_job, name, ns)
            group, version, plural = _custom(kind)
            return self._call(self.custom.get_namespaced_custom_object, group, version, ns, plural, name)
        except _ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def list(self, kind: str, ns: str, selector: str) -> list[dict[str, Any]]:
        if kind == "Pod":
            data = self._call(self.core.list_namespaced_pod, ns, label_selector=selector)
        elif kind == "Job":
            data = self._call(self.batch.list_namespaced_job, ns, label_selector=selector)
        else:
            group, version, plural = _custom(kind)
            data = self._call(self.custom.list_namespaced_custom_object, group, version, ns, plural,
                              label_selector=selector)
        return list(data.get("items") or [])

    def delete(self, kind: str, ns: str, name: str) -> bool:
        """Delete with foreground propagation; False if it was already gone."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Foreground"}
        try:
            if kind == "ConfigMap":
                self._call(self.core.delete_namespaced_config_map, name, ns, body=body)
            elif kind == "Secret":
                self._call(self.core.delete_namespaced_secret, name, ns, body=body)
            elif kind == "Service":
                self._call(self.core.delete_namespaced_service, name, ns, body=body)
            elif kind == "Job":
                self._call(self.batch.delete_namespaced_job, name, ns, body=body)
            else:
                group, version, plural = _custom(kind)
                self._call(self.custom.delete_namespaced_custom_object, group, version, ns, plural, name,
                           propagation_policy="Foreground", body=body)
        except _ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def set_owner(self, kind: str, ns: str, name: str, owner: Mapping[str, Any]) -> None:
        patch = {"metadata": {"ownerReferences": [owner]}}
        fn = {"ConfigMap": self.core.patch_namespaced_config_map, "Secret": self.core.patch_namespaced_secret,
              "Service": self.core.patch_namespaced_service}[kind]
        self._call(fn, name, ns, patch, _content_type="application/merge-patch+json")

    def pod_log(self, ns: str, pod: str, container: str, follow: bool) -> Iterator[str]:
        try:
            resp = self._raw(self.core.read_namespaced_pod_log, pod, ns, container=container, follow=follow)
        except _ApiError as exc:
            if exc.status in (400, 404):  # container not started yet, or pod gone
                return
            raise
        buffer = b""
        try:
            for chunk in resp.stream(4096):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    yield line.decode(errors="replace")
            if buffer:
                yield buffer.decode(errors="replace")
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise BackendUnavailable(f"log stream of {pod} broke: {exc}") from exc
        finally:
            resp.release_conn()


def _custom(kind: str) -> tuple[str, str, str]:
    if kind == "JobSet":
        return JOBSET_GROUP, JOBSET_VERSION, JOBSET_PLURAL
    if kind == "PyTorchJob":
        return KUBEFLOW_GROUP, KUBEFLOW_VERSION, PYTORCH_PLURAL
    raise ValueError(f"not a kind this backend manages: {kind}")


KIND_OF: dict[ObjectKind, str] = {kind: api[1] for kind, api in API_VERSIONS.items()}


# -- status mapping (pure) ------------------------------------------------------------------------

def _ts(value: Any) -> float | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _true_conditions(obj: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    conds = (obj.get("status") or {}).get("conditions") or []
    return {c["type"]: c for c in conds if isinstance(c, dict) and c.get("status") == "True" and "type" in c}


@dataclass(frozen=True)
class PodFailure:
    failure: FailureClass
    exit_code: int | None
    reason: str
    log_tail: str | None
    at: float


def pod_failure(pod: Mapping[str, Any]) -> PodFailure | None:
    """Why this pod failed, if it did: infrastructure (node, preempted) or the program (exit code)."""
    name = pod.get("metadata", {}).get("name", "?")
    status = pod.get("status") or {}
    message = str(status.get("message") or "")
    for cond in status.get("conditions") or []:
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
            why = str(cond.get("reason") or "")
            failure: FailureClass = "preempted" if why in PREEMPTION_REASONS else "node"
            text = f"pod {name}: {why}" + (f": {cond.get('message')}" if cond.get("message") else "")
            return PodFailure(failure, None, text, None, _ts(cond.get("lastTransitionTime")) or 0.0)
    if status.get("reason") in NODE_POD_REASONS:
        return PodFailure("node", None, f"pod {name}: {status['reason']}" + (f": {message}" if message else ""),
                          None, 0.0)
    for cs in status.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term and int(term.get("exitCode") or 0) != 0:
            code = int(term["exitCode"])
            why = str(term.get("reason") or "Error")
            return PodFailure("program", code, f"pod {name}: container {cs.get('name')} {why} (exit code {code})",
                              term.get("message") or None, _ts(term.get("finishedAt")) or 0.0)
    return None


def _pending_since(pod: Mapping[str, Any]) -> tuple[float, str] | None:
    """When the scheduler first said this pod does not fit anywhere, and what it said."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if (cond.get("type"), cond.get("status"), cond.get("reason")) == ("PodScheduled", "False", "Unschedulable"):
            since = _ts(cond.get("lastTransitionTime"))
            if since is not None:
                return since, str(cond.get("message") or "Unschedulable")
    return None


def pod_rank(pod: Mapping[str, Any]) -> int | None:
    """The node rank of a pod: its completion index, or its PyTorchJob replica (Master 0, Worker i+1)."""
    meta = pod.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    index = annotations.get(COMPLETION_INDEX) or labels.get(COMPLETION_INDEX)
    if index is not None:
        return int(index)
    rtype = labels.get("training.kubeflow.org/replica-type")
    rindex = labels.get("training.kubeflow.org/replica-index")
    if rtype is not None and rindex is not None:
        return int(rindex) + (0 if rtype.lower() == "master" else 1)
    return None


def observe(kind: ObjectKind, obj: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], *, now: float,
            unschedulable_after_s: float) -> Observation:
    """Map a workload object and its pods to an Observation (pure; the heart of `poll`)."""
    status = obj.get("status") or {}
    conds = _true_conditions(obj)
    if kind == "jobset":
        restarts = str(status.get("restarts") or 0)
        pods = [p for p in pods if (p.get("metadata", {}).get("labels") or {}).get(RESTART_ATTEMPT, restarts)
                == restarts]
    nodes = sorted({str(p["spec"]["nodeName"]) for p in pods if (p.get("spec") or {}).get("nodeName")})
    succeeded = {"jobset": "Completed", "indexed-job": "Complete", "pytorchjob": "Succeeded"}[kind]
    if succeeded in conds:
        return Observation(state=RunState.SUCCEEDED, nodes=nodes, exit_code=0)
    failed = conds.get("Failed") or (conds.get("FailureTarget") if kind == "indexed-job" else None)
    if failed is not None:
        return _failed(failed, pods, nodes)
    if (obj.get("metadata") or {}).get("deletionTimestamp"):
        return Observation(state=RunState.CANCELLED, nodes=nodes, failure="cancelled", reason="deleted")
    suspended = conds.get("Suspended")
    if suspended is not None or (obj.get("spec") or {}).get("suspend") is True:
        text = " ".join(str((suspended or {}).get(k) or "") for k in ("reason", "message")).strip()
        preempted = bool(re.search(r"preempt|evict", text, re.IGNORECASE))
        return Observation(state=RunState.PENDING, nodes=nodes, failure="preempted" if preempted else None,
                           reason=f"suspended (queued){': ' + text if text else ''}")
    running = any((p.get("status") or {}).get("phase") == "Running" for p in pods)
    if kind == "pytorchjob" and "Running" in conds:
        running = True
    if kind == "indexed-job" and int(status.get("ready") or 0) > 0:
        running = True
    if kind == "jobset" and any(int(r.get("ready") or 0) > 0 for r in status.get("replicatedJobsStatus") or []):
        running = True
    if running:
        reason = None
        if kind == "jobset" and int(status.get("restarts") or 0) > 0:
            reason = f"gang restarted {status['restarts']} time(s)"
        if kind == "pytorchjob" and "Restarting" in conds:
            reason = "restarting"
        return Observation(state=RunState.RUNNING, nodes=nodes, reason=reason)
    for pod in pods:
        waiting = _pending_since(pod)
        if waiting is not None and now - waiting[0] >= unschedulable_after_s:
            return Observation(state=RunState.PENDING, nodes=nodes, failure="capacity",
                               reason=f"unschedulable for {now - waiting[0]:.0f} s: {waiting[1]}")
    return Observation(state=RunState.PENDING, nodes=nodes)


def _failed(cond: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], nodes: list[str]) -> Observation:
    failures = [f for f in (pod_failure(p) for p in pods) if f is not None]
    infra = [f for f in failures if f.failure != "program"]
    if infra:
        # A lost node or a preempted pod makes the other ranks fail too: the infrastructure is the cause.
        first = min(infra, key=lambda f: (f.failure != "preempted", f.at))
        return Observation(state=RunState.FAILED, nodes=nodes, failure=first.failure, reason=first.reason)
    if failures:
        first = min(failures, key=lambda f: f.at)
        return Observation(state=RunState.FAILED, nodes=nodes, failure="program", exit_code=first.exit_code,
                           reason=first.reason, log_tail=first.log_tail)
    why = str(cond.get("reason") or "Failed")
    message = str(cond.get("message") or "")
    text = f"{why}: {message}" if message else why
    if why == "DeadlineExceeded":
        return Observation(state=RunState.FAILED, nodes=nodes, failure="timeout", reason=text)
    match = _EXIT_CODE.search(message)
    if match:
        return Observation(state=RunState.FAILED, nodes=nodes, failure="program", exit_code=int(match.group(1)),
                           reason=text)
    # Failed, and the pods that would say why are gone: the cause is unknown, so a retry is fair.
    return Observation(state=RunState.FAILED, nodes=nodes, failure="lost", reason=text)


# -- the backend ----------------------------------------------------------------------------------

def _backend_id(kind: ObjectKind, ns: str, name: str) -> str:
    return f"{kind}/{ns}/{name}"


def _parse_backend_id(handle: Handle, default_ns: str) -> tuple[ObjectKind | None, str, str]:
    if handle.backend_id:
        parts = handle.backend_id.split("/")
        if len(parts) == 3 and parts[0] in OBJECT_KINDS:
            return parts[0], parts[1], parts[2]
    return None, default_ns, k8s_name(handle.name)


class KubernetesBackend:
    """Runs each attempt as a JobSet (default), an Indexed Job + headless Service (when the cluster has
    no JobSet API) or a PyTorchJob (opt-in with `backend.object: pytorchjob`).

    `api_client` is a `kubernetes.client.ApiClient` (see `from_environment`). `namespace` is where
    jobs go unless their spec names one of `namespaces` (specs naming any other namespace are
    rejected, so `find` knows where to look). `queue_for_team` maps a team to its Kueue LocalQueue.
    `jobset`: True/False forces whether the cluster serves JobSet; None asks API discovery once.
    """

    name = "kubernetes"
    capabilities = Capabilities(multi_node=True, gpus=True, logs=True, preemption_requeue=True)

    def __init__(self, api_client: Any, *, namespace: str = "default", namespaces: Sequence[str] = (),
                 default_image: str | None = None, queue_for_team: Mapping[str, str] | None = None,
                 max_restarts: int = 3, nccl_env: Mapping[str, str] | None = None, shm_size: str | None = None,
                 ttl_seconds_after_finished: int | None = 7 * 86400, unschedulable_after_s: float = 600.0,
                 jobset: bool | None = None, request_timeout_s: float = 30.0,
                 clock: Callable[[], float] = time.time) -> None:
        options: dict[str, Any] = {"namespace": namespace, "default_image": default_image,
                                   "queue_for_team": dict(queue_for_team or {}), "max_restarts": max_restarts,
                                   "shm_size": shm_size, "ttl_seconds_after_finished": ttl_seconds_after_finished}
        if nccl_env is not None:
            options["nccl_env"] = dict(nccl_env)
        self.options = RenderOptions(**options)
        self.namespaces: tuple[str, ...] = tuple(dict.fromkeys([namespace, *namespaces]))
        self.unschedulable_after_s = unschedulable_after_s
        self._kube = _Kube(api_client, request_timeout_s)
        self._clock = clock
        self._jobset_override = jobset
        self._served: dict[ObjectKind, bool] | None = None
        # Names this process deleted: once gone they read CANCELLED, not MISSING (bounded memory).
        self._cancelled: OrderedDict[str, None] = OrderedDict()

    @classmethod
    def from_environment(cls, kubeconfig: str | Path | None = None, **kwargs: Any) -> KubernetesBackend:
        """A backend on the cluster this process is configured for: `kubeconfig` if given, else the
        in-cluster service account, else the default kubeconfig (`$KUBECONFIG`, `~/.kube/config`).
        `kwargs` are the constructor's. Raises `BackendUnavailable` when no configuration is found."""
        from kubernetes import config

        k8s_config: Any = config
        configuration: Any = k8s_client.Configuration()
        try:
            if kubeconfig is not None:
                k8s_config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
            else:
                try:
                    k8s_config.load_incluster_config(client_configuration=configuration)
                except k8s_config.ConfigException:
                    k8s_config.load_kube_config(client_configuration=configuration)
        except (k8s_config.ConfigException, OSError) as exc:
            raise BackendUnavailable(f"no Kubernetes configuration: {exc}") from exc
        return cls(k8s_client.ApiClient(configuration), **kwargs)

    # -- discovery -------------------------------------------------------------------------------
    def served(self) -> dict[ObjectKind, bool]:
        """Which workload kinds the cluster serves: API discovery (`/apis`, then the group's resource
        list), once per backend. `jobset=` in the constructor overrides the JobSet answer."""
        if self._served is None:
            groups = self._kube.served_groups()
            jobset = self._jobset_override
            if jobset is None:
                jobset = (JOBSET_VERSION in groups.get(JOBSET_GROUP, set())
                          and JOBSET_PLURAL in self._kube.resources(JOBSET_GROUP, JOBSET_VERSION))
            pytorch = (KUBEFLOW_VERSION in groups.get(KUBEFLOW_GROUP, set())
                       and PYTORCH_PLURAL in self._kube.resources(KUBEFLOW_GROUP, KUBEFLOW_VERSION))
            self._served = {"jobset": jobset, "indexed-job": True, "pytorchjob": pytorch}
        return self._served

    def object_kind(self, req: LaunchRequest, *, discover: bool) -> ObjectKind:
        """The kind to create: the spec's `backend.object`, else JobSet, else (no JobSet API) Indexed Job."""
        wanted = req.backend_options.get("object")
        if wanted is not None:
            if wanted not in OBJECT_KINDS:
                raise SubmissionRejected(f"backend.object must be one of {list(OBJECT_KINDS)}, not {wanted!r}")
            if discover and not self.served()[wanted]:
                raise SubmissionRejected(f"the cluster does not serve {wanted} (API discovery); "
                                         "install its controller or choose another backend.object")
            return cast(ObjectKind, wanted)
        if discover:
            return "jobset" if self.served()["jobset"] else "indexed-job"
        jobset = self._served["jobset"] if self._served is not None else self._jobset_override
        return "indexed-job" if jobset is False else "jobset"

    # -- protocol ----------------------------------------------------------------------------------
    def render(self, req: LaunchRequest) -> Rendered:
        """The objects `submit` would create, in creation order, as a kubectl-compatible `v1 List`
        (secret values redacted; the last item is the workload, whose kind says which object was chosen).

        Pure: never contacts the cluster. Without an explicit `backend.object` it renders JobSet
        unless an earlier discovery found no JobSet API."""
        kind = self.object_kind(req, discover=False)
        items = render_objects(req, self.options, kind, redact=True)
        return Rendered(backend=self.name, name=k8s_name(req.name),
                        content={"apiVersion": "v1", "kind": "List", "items": items})

    def submit(self, req: LaunchRequest) -> Handle:
        ns = namespace_for(req, self.options)
        if ns not in self.namespaces:
            raise SubmissionRejected(f"namespace {ns!r} is not managed by this backend (managed: "
                                     f"{list(self.namespaces)})")
        kind = self.object_kind(req, discover=True)
        try:
            objects = render_objects(req, self.options, kind, redact=False)
        except RenderError as exc:
            raise SubmissionRejected(str(exc)) from exc
        *helpers, workload = objects
        for obj in helpers:
            self._create_or_adopt(obj)
        try:
            created = self._create_or_adopt(workload)
        except SubmissionRejected:
            for obj in helpers:  # nothing will own them: do not leave them behind
                try:
                    self._kube.delete(obj["kind"], ns, obj["metadata"]["name"])
                except (_ApiError, BackendUnavailable) as exc:
                    log.warning("could not remove %s %s: %s", obj["kind"], obj["metadata"]["name"], exc)
            raise
        meta = created.get("metadata") or {}
        if meta.get("uid"):
            owner = {"apiVersion": workload["apiVersion"], "kind": workload["kind"], "name": meta["name"],
                     "uid": meta["uid"], "blockOwnerDeletion": True}
            for obj in helpers:
                try:
                    self._kube.set_owner(obj["kind"], ns, obj["metadata"]["name"], owner)
                except (_ApiError, BackendUnavailable) as exc:  # only garbage collection is at stake
                    log.warning("could not set the owner of %s %s: %s", obj["kind"], obj["metadata"]["name"], exc)
        return Handle(name=req.name, backend_id=_backend_id(kind, ns, workload["metadata"]["name"]))

    def _create_or_adopt(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        try:
            return self._kube.create(obj)
        except _ApiError as exc:
            if exc.status != 409:
                raise SubmissionRejected(f"{obj['kind']} {meta['name']}: {exc}") from exc
        existing = self._kube.get(obj["kind"], meta["namespace"], meta["name"])
        if existing is None:  # deleted between our create and our get: say so, the dispatcher retries
            raise BackendUnavailable(f"{obj['kind']} {meta['name']} existed and vanished; try again")
        if (existing.get("metadata", {}).get("labels") or {}).get(MANAGED_BY) != MANAGER:
            raise SubmissionRejected(f"{obj['kind']} {meta['name']} exists and is not managed by shardctl")
        return existing

    def find(self, name: str) -> Handle | None:
        """The workload named `name` in any managed namespace, of any served kind (one GET each)."""
        k8s = k8s_name(name)
        served = self.served()
        for ns in self.namespaces:
            for kind in OBJECT_KINDS:
                if not served[kind]:
                    continue
                obj = self._kube.get(KIND_OF[kind], ns, k8s)
                if obj is not None and (obj.get("metadata", {}).get("labels") or {}).get(MANAGED_BY) == MANAGER:
                    return Handle(name=name, backend_id=_backend_id(kind, ns, k8s))
        return None

    def poll(self, handles: Sequence[Handle]) -> dict[str, Observation]:
        """One labelled list per (namespace, kind) and one pod list per namespace, for all `handles`."""
        wanted: dict[str, set[ObjectKind]] = defaultdict(set)
        parsed = []
        for handle in handles:
            kind, ns, k8s = _parse_backend_id(handle, self.options.namespace)
            parsed.append((handle, kind, ns, k8s))
            if kind is None:
                wanted[ns].update(k for k, ok in self.served().items() if ok)
            else:
                wanted[ns].add(kind)
        objects: dict[tuple[str, ObjectKind, str], dict[str, Any]] = {}
        pods: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for ns, kinds in wanted.items():
            for kind in sorted(kinds):
                for obj in self._kube.list(KIND_OF[kind], ns, SELECTOR):
                    objects[(ns, kind, obj["metadata"]["name"])] = obj
            for pod in self._kube.list("Pod", ns, SELECTOR):
                owner = (pod.get("metadata", {}).get("labels") or {}).get(LABEL_NAME)
                if owner:
                    pods[(ns, owner)].append(pod)
        now = self._clock()
        out: dict[str, Observation] = {}
        for handle, kind, ns, k8s in parsed:
            candidates = [kind] if kind is not None else list(OBJECT_KINDS)
            found = next(((k, objects[(ns, k, k8s)]) for k in candidates if (ns, k, k8s) in objects), None)
            if found is None:
                if handle.name in self._cancelled:
                    out[handle.name] = Observation(state=RunState.CANCELLED, failure="cancelled",
                                                   reason="deleted by shardctl")
                else:
                    out[handle.name] = Observation(state=RunState.MISSING)
                continue
            out[handle.name] = observe(found[0], found[1], pods[(ns, k8s)], now=now,
                                       unschedulable_after_s=self.unschedulable_after_s)
        return out

    def cancel(self, handle: Handle) -> None:
        """Delete the workload (foreground propagation: its Jobs and pods go first) and its helper
        objects. Idempotent: what is already gone is fine. Afterwards `poll` reports the name as
        CANCELLED (while deleting, and once gone, as far as this process remembers)."""
        kind, ns, k8s = _parse_backend_id(handle, self.options.namespace)
        kinds = [kind] if kind is not None else [k for k, ok in self.served().items() if ok]
        for k in kinds:
            self._kube.delete(KIND_OF[k], ns, k8s)
        for helper in ("Service", "Secret", "ConfigMap"):
            self._kube.delete(helper, ns, k8s)
        self._cancelled[handle.name] = None
        while len(self._cancelled) > CANCELLED_MEMORY:
            self._cancelled.popitem(last=False)

    def logs(self, handle: Handle, rank: int = 0, follow: bool = False) -> Iterator[str]:
        """The log lines of the pod with node rank `rank` (the newest, after a gang restart). Nothing
        if that pod does not exist (yet)."""
        kind, ns, k8s = _parse_backend_id(handle, self.options.namespace)
        candidates = [p for p in self._kube.list("Pod", ns, f"{SELECTOR},{LABEL_NAME}={k8s}") if pod_rank(p) == rank]
        if not candidates:
            return iter(())
        pod = max(candidates, key=lambda p: str(p["metadata"].get("creationTimestamp") or ""))
        container = PYTORCH_CONTAINER if kind == "pytorchjob" else CONTAINER
        names = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
        if container not in names and names:
            container = str(names[0])
        return self._kube.pod_log(ns, pod["metadata"]["name"], container, follow)


__all__ = ["KubernetesBackend", "SubmissionRejected", "observe", "pod_failure", "pod_rank"]
