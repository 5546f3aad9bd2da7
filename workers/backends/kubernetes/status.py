"""Status mapping (pure): a workload object and its pods, as the API server returned them, to an
`Observation` (state, failure class, exit code, nodes, log tail; while pending, why: a pod's
`PodScheduled=False` condition, or a suspended workload's Kueue admission wait). `observe` is the
heart of `poll`.

Infrastructure causes win over program exits: when a node dies, the other ranks fail afterwards in
NCCL with exit 1, and the node is the real cause. See the state table in `docs/kubernetes.md`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypedDict

from service.failures import FailureClass
from workers.backends.base import Observation, RunState
from workers.backends.evidence import memory_failure, program_lines
from workers.backends.kubernetes.naming import ObjectKind

RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
#: Pod disruption reasons (condition DisruptionTarget) that mean "preempted" rather than "node".
PREEMPTION_REASONS = {"PreemptionByScheduler", "PreemptionByKueue"}
NODE_POD_REASONS = {"Evicted", "NodeLost", "NodeShutdown", "Terminated", "UnexpectedAdmissionError"}
#: Container waiting reasons that mean the container cannot be started as specified: waiting longer
#: does not help (an image that does not exist, a missing Secret key). `ErrImagePull` alone is not one:
#: the kubelet retries it, and it becomes `ImagePullBackOff` when the retry failed too.
LAUNCH_WAITING_REASONS = {"ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError",
                          "CreateContainerError"}
#: The condition that says a workload of each kind finished well.
SUCCEEDED_CONDITION: dict[ObjectKind, str] = {"jobset": "Completed", "indexed-job": "Complete",
                                              "pytorchjob": "Succeeded"}
_EXIT_CODE = re.compile(r"exit code (\d+)")


class _Metadata(TypedDict, total=False):
    name: Any
    labels: Any
    deletionTimestamp: Any


class _WorkloadSpec(TypedDict, total=False):
    suspend: Any


class _PodSpec(TypedDict, total=False):
    nodeName: Any


class WorkloadFields(TypedDict, total=False):
    """Every field of a workload object (JobSet, Job, PyTorchJob) that `observe` and `poll` read: the
    `shape` of `poll`'s workload lists (`KubeClient.list`). A field read here must be named here."""

    metadata: _Metadata | None
    spec: _WorkloadSpec | None
    status: Any


class PodFields(TypedDict, total=False):
    """Every field of a pod that `observe` and `poll` read: the `shape` of `poll`'s pod lists. A field
    read here must be named here."""

    metadata: _Metadata | None
    spec: _PodSpec | None
    status: Any


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
            failure = FailureClass.PREEMPTED if why in PREEMPTION_REASONS else FailureClass.NODE_FAILURE
            text = f"pod {name}: {why}" + (f": {cond.get('message')}" if cond.get("message") else "")
            return PodFailure(failure, None, text, None, _ts(cond.get("lastTransitionTime")) or 0.0)
    if status.get("reason") in NODE_POD_REASONS:
        return PodFailure(FailureClass.NODE_FAILURE, None,
                          f"pod {name}: {status['reason']}" + (f": {message}" if message else ""), None, 0.0)
    for cs in status.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term and int(term.get("exitCode") or 0) != 0:
            code = int(term["exitCode"])
            why = str(term.get("reason") or "Error")
            text = f"pod {name}: container {cs.get('name')} {why} (exit code {code})"
            # terminationMessagePolicy FallbackToLogsOnError: the log's end, without torchrun's own lines
            raw = str(term.get("message") or "")
            tail = "\n".join(program_lines(raw.splitlines())) or raw or None
            # OOMKilled: the kernel killed it at the container's memory limit (host memory, not the GPU's)
            cause = FailureClass.OOM_HOST if why == "OOMKilled" else memory_failure(tail or "")
            if why == "OOMKilled":
                text += ": the container's memory limit"
            return PodFailure(cause or FailureClass.PROGRAM_ERROR, code, text, tail,
                              _ts(term.get("finishedAt")) or 0.0)
    return None


def launch_failure(pod: Mapping[str, Any]) -> str | None:
    """Why this pod's container cannot start as specified (`LAUNCH_WAITING_REASONS`), in words; None
    when it is not stuck that way."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in LAUNCH_WAITING_REASONS:
            message = str(waiting.get("message") or "")
            return (f"pod {pod.get('metadata', {}).get('name', '?')}: container {cs.get('name')} "
                    f"{waiting['reason']}" + (f": {message}" if message else ""))
    return None


def _pending_since(pod: Mapping[str, Any]) -> tuple[float, str] | None:
    """When the scheduler first said this pod does not fit anywhere, and what it said."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if (cond.get("type"), cond.get("status"), cond.get("reason")) == ("PodScheduled", "False", "Unschedulable"):
            since = _ts(cond.get("lastTransitionTime"))
            if since is not None:
                return since, str(cond.get("message") or "Unschedulable")
    return None


def scheduling_wait(pods: Sequence[Mapping[str, Any]]) -> str | None:
    """Why the scheduler has not placed this workload's pods, in its words: the first pod whose
    `PodScheduled` condition is False, as "<reason>: <message>" (e.g. "Unschedulable: 0/4 nodes are
    available: 4 Insufficient nvidia.com/gpu."); None when every pod is placed or none says why."""
    for pod in pods:
        for cond in (pod.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("reason"):
                message = str(cond.get("message") or "").strip()
                return f"{cond['reason']}: {message}" if message else str(cond["reason"])
    return None


def admission_wait(obj: Mapping[str, Any]) -> str:
    """Why a suspended workload waits, in Kueue's words when the object carries them: a `QuotaReserved`
    condition that is False ("waiting for Kueue admission: <message>"), else its `Suspended`
    condition ("suspended: <reason>: <message>"), else "suspended: waiting for Kueue admission"."""
    conds = [c for c in (obj.get("status") or {}).get("conditions") or [] if isinstance(c, dict)]
    for cond in conds:
        if cond.get("type") == "QuotaReserved" and cond.get("status") == "False":
            words = ": ".join(str(cond[k]) for k in ("reason", "message") if cond.get(k))
            return "waiting for Kueue admission" + (f": {words}" if words else "")
    for cond in conds:
        if cond.get("type") == "Suspended" and cond.get("status") == "True":
            words = ": ".join(str(cond[k]) for k in ("reason", "message") if cond.get(k))
            if words:
                return f"suspended: {words}"
    return "suspended: waiting for Kueue admission"


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
    if SUCCEEDED_CONDITION[kind] in conds:
        return Observation(state=RunState.SUCCEEDED, nodes=nodes, exit_code=0)
    failed = conds.get("Failed") or (conds.get("FailureTarget") if kind == "indexed-job" else None)
    if failed is not None:
        return _failed(failed, pods, nodes)
    if (obj.get("metadata") or {}).get("deletionTimestamp"):
        return Observation(state=RunState.CANCELLED, nodes=nodes, failure=FailureClass.CANCELLED, reason="deleted")
    suspended = conds.get("Suspended")
    if suspended is not None or (obj.get("spec") or {}).get("suspend") is True:
        text = " ".join(str((suspended or {}).get(k) or "") for k in ("reason", "message")).strip()
        preempted = bool(re.search(r"preempt|evict", text, re.IGNORECASE))
        return Observation(state=RunState.PENDING, nodes=nodes, failure=FailureClass.PREEMPTED if preempted else None,
                           reason=f"suspended (queued){': ' + text if text else ''}",
                           pending_reason=admission_wait(obj))
    for pod in pods:  # one rank that cannot start holds the whole gang: a launch error, not a wait
        cannot_start = launch_failure(pod)
        if cannot_start is not None:
            return Observation(state=RunState.FAILED, nodes=nodes, failure=FailureClass.LAUNCH_ERROR,
                               reason=cannot_start)
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
    unplaced = scheduling_wait(pods)
    for pod in pods:
        waiting = _pending_since(pod)
        if waiting is not None and now - waiting[0] >= unschedulable_after_s:
            return Observation(state=RunState.PENDING, nodes=nodes, failure=FailureClass.CAPACITY,
                               reason=f"unschedulable for {now - waiting[0]:.0f} s: {waiting[1]}",
                               pending_reason=unplaced)
    return Observation(state=RunState.PENDING, nodes=nodes, pending_reason=unplaced)


def _failed(cond: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], nodes: list[str]) -> Observation:
    failures = [f for f in (pod_failure(p) for p in pods) if f is not None]
    infra = [f for f in failures if f.failure in (FailureClass.NODE_FAILURE, FailureClass.PREEMPTED)]
    if infra:
        # A lost node or a preempted pod makes the other ranks fail too: the infrastructure is the cause.
        first = min(infra, key=lambda f: (f.failure != FailureClass.PREEMPTED, f.at))
        return Observation(state=RunState.FAILED, nodes=nodes, failure=first.failure, reason=first.reason)
    if failures:
        first = min(failures, key=lambda f: f.at)
        return Observation(state=RunState.FAILED, nodes=nodes, failure=first.failure, exit_code=first.exit_code,
                           reason=first.reason, log_tail=first.log_tail)
    why = str(cond.get("reason") or "Failed")
    message = str(cond.get("message") or "")
    text = f"{why}: {message}" if message else why
    if why == "DeadlineExceeded":
        return Observation(state=RunState.FAILED, nodes=nodes, failure=FailureClass.TIMEOUT, reason=text)
    match = _EXIT_CODE.search(message)
    if match:
        return Observation(state=RunState.FAILED, nodes=nodes, failure=FailureClass.PROGRAM_ERROR,
                           exit_code=int(match.group(1)), reason=text)
    # Failed, and the pods that would say why are gone: the cause is unknown, so a retry is fair.
    return Observation(state=RunState.FAILED, nodes=nodes, failure=FailureClass.LOST, reason=text)
