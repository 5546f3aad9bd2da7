"""Pure rendering of the Kubernetes objects of one attempt: data in, plain JSON-shaped dicts out.

Nothing here talks to a cluster. `render_objects(req, options, kind)` returns, in creation order:

1. a `ConfigMap` named like the attempt, holding the plan (`plan.json`, `req.plan.model_dump_json()`),
   injected into every container as `$SHARDCTL_PLAN_JSON` through `configMapKeyRef`;
2. a `Secret` named like the attempt, holding the job token and every secret-looking user variable
   (`is_secret_env`), injected through `secretKeyRef`; its values are `<redacted>` here, and
   `with_secrets` fills them in for `submit`;
3. for the Indexed Job fallback only, a headless `Service` for rendezvous DNS;
4. the workload itself: a `JobSet` (default), an Indexed `Job`, or a Kubeflow `PyTorchJob`.

Every other variable of `req.environment()` is a plain `env` value. The workload alone carries the
Kueue labels: for a job of a Kueue-managed pool (`req.kueue`), `kueue.x-k8s.io/queue-name` (the team's
LocalQueue) and `kueue.x-k8s.io/priority-class`, and the workload is created suspended (JobSet and Job
`spec.suspend`, PyTorchJob `spec.runPolicy.suspend`) for Kueue to start; otherwise `queue-name` alone
when `RenderOptions.queue_for_team` names the team's queue (installations without pools). Quantities
are strings (`"8"`), as the `kubernetes` 37 client requires. Every `$(` that comes from the user
(command, env values) is escaped as `$$(`, so the kubelet never expands it; only the renderer's own
`$(SHARDCTL_NODE_RANK)` / `$(PET_NODE_RANK)` expand.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from service.backend_options import KubernetesOptions
from service.jobenv import PLAN
from service.redaction import REDACTED, is_secret_env
from workers.backends.base import LOG_ENV, LaunchRequest, SubmissionRefused, torchrun_command
from workers.backends.kubernetes.naming import (
    ANNOTATION_TEAM,
    COMPLETION_INDEX,
    CONFIG_MAP,
    KUEUE_PRIORITY_CLASS,
    KUEUE_QUEUE,
    LABEL_NAME,
    MANAGED_BY,
    MANAGER,
    SECRET,
    SERVICE,
    WORKLOADS,
    ObjectKind,
    k8s_name,
    labels_for,
)

RDZV_PORT = 29500
REPLICATED_JOB = "node"
CONTAINER = "trainer"
PYTORCH_CONTAINER = "pytorch"  # the Kubeflow operator finds its container by this name
PLAN_KEY = "plan.json"
OUT_DIR = "/var/run/shardctl/out"
#: Where torchrun keeps its per-rank copies of what it tees to the pod's log (container-local scratch;
#: the pod log, read through the API, is what `logs.py` reads, with each line's rank prefix).
TORCHRUN_LOG_DIR = "/tmp/torchrun"
NODE_RANK_ENV = "SHARDCTL_NODE_RANK"

DEFAULT_NCCL_ENV: dict[str, str] = {
    "NCCL_DEBUG": "WARN",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
    "PYTHONUNBUFFERED": "1",
}


class RenderError(SubmissionRefused, ValueError):
    """The request cannot be rendered as valid objects (no image, no node). A `SubmissionRefused`; also a
    `ValueError`, which is what `POST /v1/plans` turns into a 422 for a preview."""


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


def kubernetes_options(req: LaunchRequest) -> KubernetesOptions:
    """The spec's Kubernetes options (validated at submit); any other backend's options are refused."""
    if not isinstance(req.options, KubernetesOptions):
        raise SubmissionRefused(f"the Kubernetes backend was given {req.options.kind} options (backend.kind "
                                f"{req.options.kind!r}); the spec must say backend.kind: kubernetes")
    return req.options


def namespace_for(req: LaunchRequest, options: RenderOptions) -> str:
    return kubernetes_options(req).namespace or options.namespace


def image_for(req: LaunchRequest, options: RenderOptions) -> str:
    image = req.image or options.default_image
    if not image:
        raise RenderError("no container image: set entrypoint.image in the spec or the backend's default_image")
    return image


def _escape(value: str) -> str:
    return value.replace("$(", "$$(")


def _environment(req: LaunchRequest) -> dict[str, str]:
    return req.environment(out_dir=OUT_DIR)


def secret_values(req: LaunchRequest) -> dict[str, str]:
    """The variables that go into the attempt's Secret, with their real values (only `submit` uses them)."""
    return {k: v for k, v in sorted(_environment(req).items()) if is_secret_env(k)}


def _env(req: LaunchRequest, options: RenderOptions, name: str, kind: ObjectKind) -> list[dict[str, Any]]:
    variables = _environment(req)
    env: list[dict[str, Any]] = []
    if kind != "pytorchjob":
        env.append({"name": NODE_RANK_ENV,
                    "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}})
    env.append({"name": PLAN, "valueFrom": {"configMapKeyRef": {"name": name, "key": PLAN_KEY}}})
    for key in sorted(k for k in variables if is_secret_env(k)):
        env.append({"name": key, "valueFrom": {"secretKeyRef": {"name": name, "key": key}}})
    plain = {**options.nccl_env, **LOG_ENV,
             **{k: v for k, v in variables.items() if k != PLAN and not is_secret_env(k)}}
    env.extend({"name": key, "value": _escape(plain[key])} for key in sorted(plain))
    return env


def _pod_template(req: LaunchRequest, options: RenderOptions, name: str, kind: ObjectKind,
                  rdzv_endpoint: str) -> dict[str, Any]:
    k8s = kubernetes_options(req)
    node_rank = "$(PET_NODE_RANK)" if kind == "pytorchjob" else f"$({NODE_RANK_ENV})"
    escaped = req.model_copy(update={"command": [_escape(part) for part in req.command]})
    command = torchrun_command(escaped, rdzv_endpoint=rdzv_endpoint, node_rank=node_rank, log_dir=TORCHRUN_LOG_DIR)
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
    if k8s.node_selector:
        spec["nodeSelector"] = dict(k8s.node_selector)
    if k8s.tolerations:
        spec["tolerations"] = [t.as_k8s() for t in k8s.tolerations]
    if kind == "indexed-job":
        spec["subdomain"] = name  # hostname <job>-<index>, FQDN <job>-<index>.<service>
    return {"metadata": {"labels": labels_for(req)}, "spec": spec}


def _metadata(req: LaunchRequest, options: RenderOptions, name: str, *, queue: bool = False) -> dict[str, Any]:
    labels = labels_for(req)
    if queue and req.kueue is not None:  # a Kueue-managed pool: the names `shardctl export kueue` renders
        labels[KUEUE_QUEUE] = req.kueue.queue
        labels[KUEUE_PRIORITY_CLASS] = req.kueue.priority_class
    elif queue and req.team in options.queue_for_team:
        labels[KUEUE_QUEUE] = options.queue_for_team[req.team]
    return {"name": name, "namespace": namespace_for(req, options), "labels": labels,
            "annotations": {ANNOTATION_TEAM: req.team}}


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
    api = WORKLOADS[kind]
    template = _pod_template(req, options, name, kind, rendezvous_endpoint(kind, name))
    ttl = options.ttl_seconds_after_finished
    obj: dict[str, Any] = {"apiVersion": api.api_version, "kind": api.kind,
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
        if req.kueue is not None:
            run_policy["suspend"] = True
        if ttl is not None:
            run_policy["ttlSecondsAfterFinished"] = ttl
        spec = {"nprocPerNode": str(req.procs_per_node), "runPolicy": run_policy, "pytorchReplicaSpecs": replicas}
    if ttl is not None and kind != "pytorchjob":
        spec["ttlSecondsAfterFinished"] = ttl
    if req.kueue is not None and kind != "pytorchjob":
        spec["suspend"] = True  # Kueue unsuspends it on admission
    obj["spec"] = spec
    return obj


def render_objects(req: LaunchRequest, options: RenderOptions, kind: ObjectKind) -> list[dict[str, Any]]:
    """Every object of the attempt, in creation order (see the module docstring), secret values
    `<redacted>`: what a dry run shows, and (through `with_secrets`) exactly what `submit` creates.
    Raises `RenderError` for a request that cannot become valid objects."""
    if req.nodes < 1 or req.procs_per_node < 1:
        raise RenderError("a job needs at least one node and one process per node")
    name = k8s_name(req.name)
    variables = _environment(req)
    objects: list[dict[str, Any]] = [
        {"apiVersion": CONFIG_MAP.api_version, "kind": CONFIG_MAP.kind, "metadata": _metadata(req, options, name),
         "data": {PLAN_KEY: variables[PLAN]}}]
    secrets = {k: REDACTED for k in sorted(variables) if is_secret_env(k)}
    if secrets:
        objects.append({"apiVersion": SECRET.api_version, "kind": SECRET.kind,
                        "metadata": _metadata(req, options, name), "type": "Opaque", "stringData": secrets})
    if kind == "indexed-job":
        objects.append({"apiVersion": SERVICE.api_version, "kind": SERVICE.kind,
                        "metadata": _metadata(req, options, name),
                        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                                 "selector": {LABEL_NAME: name, MANAGED_BY: MANAGER},
                                 "ports": [{"name": "c10d", "port": RDZV_PORT, "targetPort": RDZV_PORT}]}})
    objects.append(render_workload(req, options, kind))
    return objects


def with_secrets(objects: Sequence[Mapping[str, Any]], secrets: Mapping[str, str]) -> list[dict[str, Any]]:
    """`objects` (as rendered) with the Secret's redacted values replaced by `secrets`; every other
    object unchanged. Raises `ValueError` if the rendered Secret and `secrets` name different keys."""
    out = [copy.deepcopy(dict(obj)) for obj in objects]
    for obj in out:
        if (obj.get("apiVersion"), obj.get("kind")) == (SECRET.api_version, SECRET.kind):
            shown = obj.get("stringData") or {}
            if set(shown) != set(secrets):
                raise ValueError(f"the rendered Secret holds {sorted(shown)}, not {sorted(secrets)}")
            obj["stringData"] = {key: secrets[key] for key in shown}
    return out
