"""The Kubernetes backend: a JobSet (or Indexed Job + headless Service, or a Kubeflow PyTorchJob) per
attempt, through `KubeClient` (one DynamicClient code path for every kind).

Contracts (see `docs/kubernetes.md` for the whole picture):

- `render(req)` is pure: the objects `submit` creates, secrets redacted (`render.render_objects`).
- `submit(req)` creates exactly those objects, secrets filled in, in order: the ConfigMap (plan), the
  Secret (job token), the Service (Indexed Job only), then the workload, all named like the attempt.
  An `AlreadyExists` (409) on any of them means a previous try got that far: the object is adopted
  (if shardctl manages it), never recreated. The helper objects are then given an ownerReference to
  the workload, so Kubernetes garbage-collects them with it.
- `find(name)` looks the name up in each namespace this backend manages, for each served kind.
- `poll(handles)` makes one labelled list per (namespace, workload kind) plus one labelled pod list
  per namespace, whatever the number of jobs, and maps them with `status.observe`.
- `cancel(handle)` deletes with `propagationPolicy=Foreground`; 404 is success.
- Errors are `base`'s three (`client` says which answer is which); a namespace this backend does not
  manage, a kind the cluster does not serve, or a request that cannot be rendered is `SubmissionRefused`.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kubernetes import client as k8s_client

from workers.backends.base import (
    ArtifactInfo,
    BackendError,
    BackendUnavailable,
    FailureClass,
    Handle,
    LaunchRequest,
    LogChunk,
    Observation,
    Rendered,
    RunState,
    SubmissionRefused,
    TransientBackendError,
)
from workers.backends.kubernetes.client import AlreadyExists, KubeClient
from workers.backends.kubernetes.logs import attempt_pods, no_artifacts, read_pod_logs
from workers.backends.kubernetes.naming import (
    HELPERS,
    LABEL_NAME,
    OBJECT_KINDS,
    POD,
    SELECTOR,
    WORKLOADS,
    ObjectKind,
    api_type,
    is_managed,
    k8s_name,
)
from workers.backends.kubernetes.render import (
    RenderOptions,
    kubernetes_options,
    namespace_for,
    render_objects,
    secret_values,
    with_secrets,
)
from workers.backends.kubernetes.status import PodFields, WorkloadFields, observe

log = logging.getLogger("shardctl.backends.kubernetes")

#: How many names this process remembers deleting (so they read CANCELLED once gone, not MISSING).
CANCELLED_MEMORY = 10_000


def backend_id(kind: ObjectKind, ns: str, name: str) -> str:
    return f"{kind}/{ns}/{name}"


def parse_backend_id(handle: Handle, default_ns: str) -> tuple[ObjectKind | None, str, str]:
    """(kind, namespace, object name) of a handle; kind None when the handle has no usable backend id."""
    if handle.backend_id:
        kind, _, rest = handle.backend_id.partition("/")
        ns, _, name = rest.partition("/")
        for known in OBJECT_KINDS:
            if kind == known and ns and name and "/" not in name:
                return known, ns, name
    return None, default_ns, k8s_name(handle.name)


class KubernetesBackend:
    """Runs each attempt as a JobSet (default), an Indexed Job + headless Service (when the cluster has
    no JobSet API) or a PyTorchJob (opt-in with `backend.object: pytorchjob`).

    `api_client` is a `kubernetes.client.ApiClient` (see `from_environment`). `namespace` is where
    jobs go unless their spec names one of `namespaces` (specs naming any other namespace are
    refused, so `find` knows where to look). `queue_for_team` maps a team to its Kueue LocalQueue.
    `jobset`: True/False forces whether the cluster serves JobSet; None asks API discovery once.
    """

    name = "kubernetes"

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
        self._kube = KubeClient(api_client, request_timeout_s)
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
        """Which workload kinds the cluster serves, by API discovery, once per backend (Job always).
        `jobset=` in the constructor overrides the JobSet answer."""
        if self._served is None:
            jobset = self._jobset_override
            if jobset is None:
                jobset = self._kube.serves(WORKLOADS["jobset"])
            self._served = {"jobset": jobset, "indexed-job": True,
                            "pytorchjob": self._kube.serves(WORKLOADS["pytorchjob"])}
        return self._served

    def object_kind(self, req: LaunchRequest, *, discover: bool) -> ObjectKind:
        """The kind to create: the spec's `backend.object`, else JobSet, else (no JobSet API) Indexed Job."""
        wanted = kubernetes_options(req).object
        if wanted is not None:
            if discover and not self.served()[wanted]:
                raise SubmissionRefused(f"the cluster does not serve {wanted} (API discovery); "
                                        "install its controller or choose another backend.object")
            return wanted
        if discover:
            return "jobset" if self.served()["jobset"] else "indexed-job"
        jobset = self._served["jobset"] if self._served is not None else self._jobset_override
        return "indexed-job" if jobset is False else "jobset"

    # -- protocol ----------------------------------------------------------------------------------
    def _rendered(self, req: LaunchRequest, kind: ObjectKind) -> Rendered:
        items = render_objects(req, self.options, kind)
        return Rendered(backend=self.name, name=k8s_name(req.name),
                        content={"apiVersion": "v1", "kind": "List", "items": items})

    def render(self, req: LaunchRequest) -> Rendered:
        """The objects `submit` creates, in creation order, as a kubectl-compatible `v1 List` (secret
        values redacted; the last item is the workload, whose kind says which object was chosen).

        Pure: never contacts the cluster. Without an explicit `backend.object` it renders JobSet
        unless the constructor or an earlier discovery found no JobSet API."""
        return self._rendered(req, self.object_kind(req, discover=False))

    def submit(self, req: LaunchRequest) -> Handle:
        ns = namespace_for(req, self.options)
        if ns not in self.namespaces:
            raise SubmissionRefused(f"namespace {ns!r} is not managed by this backend (managed: "
                                    f"{list(self.namespaces)})")
        kind = self.object_kind(req, discover=True)
        # What render() shows once discovery is known, secrets filled in: nothing else is sent.
        objects = with_secrets(self._rendered(req, kind).content["items"], secret_values(req))
        *helpers, workload = objects
        made: list[Mapping[str, Any]] = []
        try:
            for obj in helpers:
                self._create_or_adopt(obj)
                made.append(obj)
            created = self._create_or_adopt(workload)
        except SubmissionRefused:
            self._remove(made, ns)  # nothing will own them: do not leave them behind
            raise
        meta = created.get("metadata") or {}
        if meta.get("uid"):
            owner = {"apiVersion": workload["apiVersion"], "kind": workload["kind"], "name": meta["name"],
                     "uid": meta["uid"], "blockOwnerDeletion": True}
            for obj in helpers:
                try:
                    self._kube.merge_patch(api_type(obj), ns, obj["metadata"]["name"],
                                           {"metadata": {"ownerReferences": [owner]}})
                except BackendError as exc:  # only garbage collection is at stake
                    log.warning("could not set the owner of %s %s: %s", obj["kind"], obj["metadata"]["name"], exc)
        return Handle(name=req.name, backend_id=backend_id(kind, ns, workload["metadata"]["name"]))

    def _create_or_adopt(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        try:
            return self._kube.create(obj)
        except AlreadyExists:
            pass
        existing = self._kube.get(api_type(obj), meta["namespace"], meta["name"])
        if existing is None:  # deleted between our create and our get: the next try creates it
            raise TransientBackendError(f"{obj['kind']} {meta['name']} existed and vanished; try again")
        if not is_managed(existing):
            raise SubmissionRefused(f"{obj['kind']} {meta['name']} exists and is not managed by shardctl")
        return existing

    def _remove(self, objects: Sequence[Mapping[str, Any]], ns: str) -> None:
        for obj in objects:
            try:
                self._kube.delete(api_type(obj), ns, obj["metadata"]["name"])
            except BackendError as exc:
                log.warning("could not remove %s %s: %s", obj["kind"], obj["metadata"]["name"], exc)

    def find(self, name: str) -> Handle | None:
        """The workload named `name` in any managed namespace, of any served kind (one GET each)."""
        k8s = k8s_name(name)
        served = self.served()
        for ns in self.namespaces:
            for kind in OBJECT_KINDS:
                if served[kind] and is_managed(self._kube.get(WORKLOADS[kind], ns, k8s)):
                    return Handle(name=name, backend_id=backend_id(kind, ns, k8s))
        return None

    def poll(self, handles: Sequence[Handle]) -> dict[str, Observation]:
        """One labelled list per (namespace, kind) and one pod list per namespace, for all `handles`; each
        list holds only the fields `observe` reads (`WorkloadFields`, `PodFields`)."""
        wanted: dict[str, set[ObjectKind]] = defaultdict(set)
        parsed = []
        for handle in handles:
            kind, ns, k8s = parse_backend_id(handle, self.options.namespace)
            parsed.append((handle, kind, ns, k8s))
            if kind is None:
                wanted[ns].update(k for k, ok in self.served().items() if ok)
            else:
                wanted[ns].add(kind)
        objects: dict[tuple[str, ObjectKind, str], dict[str, Any]] = {}
        pods: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for ns, kinds in wanted.items():
            for kind in sorted(kinds):
                for obj in self._kube.list(WORKLOADS[kind], ns, SELECTOR, shape=WorkloadFields):
                    objects[(ns, kind, obj["metadata"]["name"])] = obj
            for pod in self._kube.list(POD, ns, SELECTOR, shape=PodFields):
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
                    out[handle.name] = Observation(state=RunState.CANCELLED, failure=FailureClass.CANCELLED,
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
        kind, ns, k8s = parse_backend_id(handle, self.options.namespace)
        kinds = [kind] if kind is not None else [k for k, ok in self.served().items() if ok]
        for k in kinds:
            self._kube.delete(WORKLOADS[k], ns, k8s)
        for helper in HELPERS:
            self._kube.delete(helper, ns, k8s)
        self._cancelled[handle.name] = None
        while len(self._cancelled) > CANCELLED_MEMORY:
            self._cancelled.popitem(last=False)

    def preempt(self, handle: Handle, grace_s: float) -> None:
        """Delete the workload with `gracePeriodSeconds` = `grace_s`: every pod gets SIGTERM (the runtime
        checkpoints into its output volume and exits) and is killed when the grace period is over. The
        dispatcher, which asked, records the end as `preempted` and queues the job again. Idempotent."""
        kind, ns, k8s = parse_backend_id(handle, self.options.namespace)
        kinds = [kind] if kind is not None else [k for k, ok in self.served().items() if ok]
        for k in kinds:
            self._kube.delete(WORKLOADS[k], ns, k8s, grace_period_s=max(0, round(grace_s)))
        for helper in HELPERS:
            self._kube.delete(helper, ns, k8s)

    # -- outputs (`base.LogReading`; `logs` reads the pods' logs through the API) ----------------------------
    def read_logs(self, handle: Handle, *, rank: int | None, cursor: str | None, limit: int) -> LogChunk:
        """The attempt's pod logs (see `logs`). Finished once every pod has terminated (checked before
        the logs are read, so nothing they printed is missed)."""
        _, ns, k8s = parse_backend_id(handle, self.options.namespace)
        pods = attempt_pods(self._kube, ns, k8s)
        done = bool(pods) and all((p.get("status") or {}).get("phase") in ("Succeeded", "Failed") for p in pods)
        return read_pod_logs(self._kube, pods, rank=rank, cursor=cursor, limit=limit, finished=done)

    def list_artifacts(self, handle: Handle) -> list[ArtifactInfo]:
        raise no_artifacts()

    def read_artifact(self, handle: Handle, path: str, *, max_bytes: int) -> bytes:
        raise no_artifacts()
