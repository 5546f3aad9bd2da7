"""Pure rendering of Kubernetes objects for one attempt: data in, plain JSON-shaped dicts out.

Nothing here talks to a cluster. `render_objects(req, options)` returns, in creation order:

1. a `ConfigMap` named like the attempt, holding the plan (`plan.json`), injected into every
   container as `$SHARDCTL_PLAN_JSON` through `configMapKeyRef`;
2. a `Secret` named like the attempt, holding every secret-looking variable of `req.env` (the job
   token), injected through `secretKeyRef` (only when there is one);
3. for the Indexed Job fallback only, a headless `Service` for rendezvous DNS;
4. the workload itself: a `JobSet` (default), an Indexed `Job`, or a Kubeflow `PyTorchJob`.

Contracts:

- Names are deterministic: every object is named `k8s_name(req.name)` (a DNS-1123 label).
- Every object carries `app.kubernetes.io/managed-by: shardctl`, `shardctl.dev/job-id`,
  `shardctl.dev/attempt` and `shardctl.dev/name`; the pod templates carry them too, so one
  labelled pod list finds every pod of every job. The workload alone also carries the Kueue
  `kueue.x-k8s.io/queue-name` label when the team has a queue.
- Quantities are strings (`"8"`), as the `kubernetes` 37 client requires.
- Every `$(` that comes from the user (command, env values) is escaped as `$$(`, so the kubelet never
  expands it; only the renderer's own `$(SHARDCTL_NODE_RANK)` / `$(PET_NODE_RANK)` expand.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from workers.backends.base import OUT_ENV, PLAN_ENV, REDACTED, LaunchRequest, is_secret_env, torchrun_command

ObjectKind = Literal["jobset", "indexed-job", "pytorchjob"]
OBJECT_KINDS: tuple[ObjectKind, ...] = ("jobset", "indexed-job", "pytorchjob")

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "shardctl"
LABEL_JOB_ID = "shardctl.dev/job-id"
LABEL_ATTEMPT = "shardctl.dev/attempt"
LABEL_NAME = "shardctl.dev/name"
KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"

RDZV_PORT = 29500
REPLICATED_JOB = "node"
CONTAINER = "trainer"
PYTORCH_CONTAINER = "pytorch"  # the Kubeflow operator finds its container by this name
PLAN_KEY = "plan.json"
OUT_DIR = "/var/run/shardctl/out"
NODE_RANK_ENV = "SHARDCTL_NODE_RANK"

DEFAULT_NCCL_ENV: dict[str, str] = {
    "NCCL_DEBUG": "WARN",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
    "PYTHONUNBUFFERED": "1",
}

API_VERSIONS: dict[ObjectKind, tuple[str, str]] = {
    "jobset": ("jobset.x-k8s.io/v1alpha2", "JobSet"),
    "indexed-job": ("batch/v1", "Job"),
    "pytorchjob": ("kubeflow.org/v1", "PyTorchJob"),
}

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_TOLERATION_KEYS = {"key", "operator", "value", "effect", "tolerationSeconds"}
#: JobSet pods are named `<jobset>-node-<job index>-<pod index>-<5 random>`; keep that within 63.
MAX_NAME = 40


class RenderError(ValueError):
    """The request cannot be rendered as valid objects (no image, a bad toleration...)."""


class RenderOptions(BaseModel):
    """Cluster-wide choices the backend makes for every job (not per spec)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    namespace: str = "default"
    default_image: str | None = None
    queue_for_team: dict[str, str] = Field(default_factory=dict)
    max_restarts: int = Field(3, ge=0, description="JobSet gang restarts before the JobSet fails.")
    nccl_env: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_NCCL_ENV))
    shm_size: str | None = Field(None, description="sizeLimit of the /dev/shm memory volume (e.g. 64Gi).")
    ttl_seconds_after_finished: int | None = Field(7 * 86400, ge=0)


def k8s_name(name: str) -> str:
    """A DNS-1123 label for `name`, at most MAX_NAME characters. A valid short name (`shardctl-<id>-<n>`)
    passes through unchanged; anything else is lower-cased, cleaned and given a stable hash suffix."""
    if len(name) <= MAX_NAME and _DNS_LABEL.match(name):
        return name
    low = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-") or "job"
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{low[: MAX_NAME - 9].rstrip('-')}-{digest}"


def _escape(value: str) -> str:
    return value.replace("$(", "$$(")


def labels_for(req: LaunchRequest) -> dict[str, str]:
    """The identity labels every object and pod of this attempt carries."""
    return {MANAGED_BY: MANAGER, LABEL_JOB_ID: str(req.job_id), LABEL_ATTEMPT: str(req.attempt),
            LABEL_NAME: k8s_name(req.name)}


def namespace_for(req: LaunchRequest, options: RenderOptions) -> str:
    ns = req.backend_options.get("namespace")
    return str(ns) if ns else options.namespace


def image_for(req: LaunchRequest, options: RenderOptions) -> str:
    entry = req.spec.get("entrypoint") or {}
    image = req.image or entry.get("image") or options.default_image
    if not image:
        raise RenderError("no container image: set entrypoint.image in the spec or the backend's default_image")
    return str(image)


def _tolerations(req: LaunchRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, raw in enumerate(req.backend_options.get("tolerations") or []):
        unknown = set(raw) - _TOLERATION_KEYS
        if unknown:
            raise RenderError(f"backend.tolerations[{i}]: unknown keys {sorted(unknown)}; allowed:"
                              f" {sorted(_TOLERATION_KEYS)}")
        tol: dict[str, Any] = {k: raw[k] for k in ("key", "operator", "value", "effect") if k in raw}
        if "tolerationSeconds" in raw:
            try:
                tol["tolerationSeconds"] = int(raw["tolerationSeconds"])
            except ValueError as exc:
                raise RenderError(f"backend.tolerations[{i}].tolerationSeconds must be an integer") from exc
        out.append(tol)
    return out


def _env(req: LaunchRequest, options: RenderOptions, name: str, kind: ObjectKind) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = []
    if kind != "pytorchjob":
        env.append({"name": NODE_RANK_ENV,
                    "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}})
    plain = {**options.nccl_env, **{k: v for k, v in req.env.items() if k != PLAN_ENV and not is_secret_env(k)}}
    plain.setdefault(OUT_ENV, OUT_DIR)
    env.append({"name": PLAN_ENV, "valueFrom": {"configMapKeyRef": {"name": name, "key": PLAN_KEY}}})
    for key in sorted(k for k in req.env if is_secret_env(k)):
        env.append({"name": key, "valueFrom": {"secretKeyRef": {"name": name, "key": key}}})
    env.extend({"name": key, "value": _escape(plain[key])} for key in sorted(plain))
    return env


def _pod_template(req: LaunchRequest, options: RenderOptions, name: str, kind: ObjectKind,
                  rdzv_endpoint: str) -> dict[str, Any]:
    node_rank = "$(PET_NODE_RANK)" if kind == "pytorchjob" else f"$({NODE_RANK_ENV})"
    escaped = req.model_copy(update={"command": [_escape(part) for part in req.command]})
    command = torchrun_command(escaped, rdzv_endpoint=rdzv_endpoint, node_rank=node_rank)
    container: dict[str, Any] = {
        "name": PYTORCH_CONTAINER if kind == "pytorchjob" else CONTAINER,
        "image": image_for(req, options),
        "command": command,
        "env": _env(req, options, name, kind),
        "ports": [{"name": "pytorchjob-port" if kind == "pytorchjob" else "c10d", "containerPort": RDZV_PORT}],
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}, {"name": "out", "mountPath": OUT_DIR}],
        # On a non-zero exit the kubelet copies the log tail into the pod status: the failure's log
        # tail comes with the one pod list per cycle, without a log call per job.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    gpus = req.procs_per_node * req.gpus_per_proc
    if gpus > 0:
        # GPUs go in limits only; the request defaults to the limit (and must equal it if set).
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    shm: dict[str, Any] = {"medium": "Memory"}
    if options.shm_size:
        shm["sizeLimit"] = options.shm_size
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [container],
        "volumes": [{"name": "dshm", "emptyDir": shm}, {"name": "out", "emptyDir": {}}],
    }
    node_selector = req.backend_options.get("node_selector") or {}
    if node_selector:
        spec["nodeSelector"] = {str(k): str(v) for k, v in node_selector.items()}
    tolerations = _tolerations(req)
    if tolerations:
        spec["tolerations"] = tolerations
    if kind == "indexed-job":
        spec["subdomain"] = name  # hostname <job>-<index>, FQDN <job>-<index>.<service>
    return {"metadata": {"labels": labels_for(req)}, "spec": spec}


def _metadata(req: LaunchRequest, options: RenderOptions, name: str, *, queue: bool = False) -> dict[str, Any]:
    labels = labels_for(req)
    if queue and req.team in options.queue_for_team:
        labels[KUEUE_QUEUE] = options.queue_for_team[req.team]
    return {"name": name, "namespace": namespace_for(req, options), "labels": labels,
            "annotations": {"shardctl.dev/team": req.team}}


def rendezvous_endpoint(kind: ObjectKind, name: str) -> str:
    """The stable DNS name (and port) of the node with rank 0."""
    if kind == "jobset":
        return f"{name}-{REPLICATED_JOB}-0-0.{name}:{RDZV_PORT}"
    if kind == "indexed-job":
        return f"{name}-0.{name}:{RDZV_PORT}"
    return f"{name}-master-0:{RDZV_PORT}"


def _pod_failure_policy(container: str) -> dict[str, Any]:
    """Disruptions (eviction, preemption, node loss) count as an ordinary failure, so JobSet restarts
    the gang; a non-zero exit of the program fails the Job with reason PodFailurePolicy at once."""
    return {"rules": [
        {"action": "Count", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {"action": "FailJob", "onExitCodes": {"containerName": container, "operator": "NotIn", "values": [0]}},
    ]}


def _job_spec(req: LaunchRequest, template: dict[str, Any]) -> dict[str, Any]:
    return {"completionMode": "Indexed", "completions": req.nodes, "parallelism": req.nodes, "backoffLimit": 0,
            "podFailurePolicy": _pod_failure_policy(CONTAINER), "template": template}


def render_workload(req: LaunchRequest, options: RenderOptions, kind: ObjectKind) -> dict[str, Any]:
    """The top-level object (JobSet, Job or PyTorchJob) for `req`."""
    name = k8s_name(req.name)
    api_version, api_kind = API_VERSIONS[kind]
    template = _pod_template(req, options, name, kind, rendezvous_endpoint(kind, name))
    ttl = options.ttl_seconds_after_finished
    obj: dict[str, Any] = {"apiVersion": api_version, "kind": api_kind,
                           "metadata": _metadata(req, options, name, queue=True)}
    if kind == "jobset":
        spec: dict[str, Any] = {
            "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True, "subdomain": name},
            "successPolicy": {"operator": "All"},
            "failurePolicy": {"maxRestarts": options.max_restarts, "rules": [
                {"name": "program-error", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}]},
            "replicatedJobs": [{"name": REPLICATED_JOB, "replicas": 1,
                                "template": {"metadata": {"labels": labels_for(req)},
                                             "spec": _job_spec(req, template)}}],
        }
    elif kind == "indexed-job":
        spec = _job_spec(req, template)
    else:
        replica = {"replicas": 1, "restartPolicy": "Never", "template": template}
        replicas: dict[str, Any] = {"Master": replica}
        if req.nodes > 1:
            replicas["Worker"] = {**copy.deepcopy(replica), "replicas": req.nodes - 1}
        run_policy: dict[str, Any] = {"backoffLimit": 0, "cleanPodPolicy": "Running"}
        if ttl is not None:
            run_policy["ttlSecondsAfterFinished"] = ttl
        spec = {"nprocPerNode": str(req.procs_per_node), "runPolicy": run_policy, "pytorchReplicaSpecs": replicas}
    if ttl is not None and kind != "pytorchjob":
        spec["ttlSecondsAfterFinished"] = ttl
    obj["spec"] = spec
    return obj


def render_objects(req: LaunchRequest, options: RenderOptions, kind: ObjectKind, *,
                   redact: bool = True) -> list[dict[str, Any]]:
    """Every object of the attempt, in creation order (see the module docstring).

    `redact=True` (what `render()` shows) replaces secret values with `<redacted>`; `submit` uses
    `redact=False`. Raises `RenderError` for a request that cannot become valid objects."""
    name = k8s_name(req.name)
    if kind not in API_VERSIONS:
        raise RenderError(f"backend.object must be one of {list(OBJECT_KINDS)}, not {kind!r}")
    if req.nodes < 1 or req.procs_per_node < 1:
        raise RenderError("a job needs at least one node and one process per node")
    objects: list[dict[str, Any]] = []
    plan = req.env.get(PLAN_ENV) or json.dumps(req.plan, sort_keys=True)
    objects.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": _metadata(req, options, name),
                    "data": {PLAN_KEY: plan}})
    secrets = {k: (REDACTED if redact else v) for k, v in sorted(req.env.items()) if is_secret_env(k)}
    if secrets:
        objects.append({"apiVersion": "v1", "kind": "Secret", "metadata": _metadata(req, options, name),
                        "type": "Opaque", "stringData": secrets})
    if kind == "indexed-job":
        objects.append({"apiVersion": "v1", "kind": "Service", "metadata": _metadata(req, options, name),
                        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                                 "selector": {LABEL_NAME: name, MANAGED_BY: MANAGER},
                                 "ports": [{"name": "c10d", "port": RDZV_PORT, "targetPort": RDZV_PORT}]}})
    objects.append(render_workload(req, options, kind))
    return objects
