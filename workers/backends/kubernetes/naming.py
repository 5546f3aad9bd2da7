"""What the Kubernetes backend creates and how it finds it again: the API types it uses, the name
every object of an attempt gets, and the identity labels every object and pod carries.

- Names are deterministic: every object of an attempt is named `k8s_name(req.name)` (a DNS-1123 label).
- Every object carries `app.kubernetes.io/managed-by: shardctl`, `shardctl.dev/job-id`,
  `shardctl.dev/attempt` and `shardctl.dev/name`; the pod templates carry them too, so one labelled
  pod list (`SELECTOR`) finds every pod of every job.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from service.scheduling.kueue_names import PRIORITY_CLASS_LABEL, QUEUE_LABEL
from workers.backends.base import LaunchRequest

#: The workload object that runs a job: the values of the spec's `backend.object`.
ObjectKind = Literal["jobset", "indexed-job", "pytorchjob"]
OBJECT_KINDS: tuple[ObjectKind, ...] = ("jobset", "indexed-job", "pytorchjob")


@dataclass(frozen=True)
class ApiType:
    """One API type, as DynamicClient looks it up: `resources.get(api_version=..., kind=...)`."""

    api_version: str
    kind: str

    @property
    def core(self) -> bool:
        return "/" not in self.api_version


WORKLOADS: dict[ObjectKind, ApiType] = {
    "jobset": ApiType("jobset.x-k8s.io/v1alpha2", "JobSet"),
    "indexed-job": ApiType("batch/v1", "Job"),
    "pytorchjob": ApiType("kubeflow.org/v1", "PyTorchJob"),
}
CONFIG_MAP = ApiType("v1", "ConfigMap")
SECRET = ApiType("v1", "Secret")
SERVICE = ApiType("v1", "Service")
POD = ApiType("v1", "Pod")
#: The objects that live next to the workload (in `cancel`'s deletion order).
HELPERS: tuple[ApiType, ...] = (SERVICE, SECRET, CONFIG_MAP)


def api_type(obj: Mapping[str, Any]) -> ApiType:
    """The API type of a rendered object."""
    return ApiType(str(obj["apiVersion"]), str(obj["kind"]))


MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "shardctl"
LABEL_JOB_ID = "shardctl.dev/job-id"
LABEL_ATTEMPT = "shardctl.dev/attempt"
LABEL_NAME = "shardctl.dev/name"
ANNOTATION_TEAM = "shardctl.dev/team"
KUEUE_QUEUE = QUEUE_LABEL  # kueue.x-k8s.io/queue-name
KUEUE_PRIORITY_CLASS = PRIORITY_CLASS_LABEL  # kueue.x-k8s.io/priority-class
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
#: The one label selector of every list the backend makes.
SELECTOR = f"{MANAGED_BY}={MANAGER}"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
#: JobSet pods are named `<jobset>-node-<job index>-<pod index>-<5 random>`; keep that within 63.
MAX_NAME = 40


def k8s_name(name: str) -> str:
    """A DNS-1123 label for `name`, at most MAX_NAME characters. A valid short name (`shardctl-<id>-<n>`)
    passes through unchanged; anything else is lower-cased, cleaned and given a stable hash suffix."""
    if len(name) <= MAX_NAME and _DNS_LABEL.match(name):
        return name
    low = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-") or "job"
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{low[: MAX_NAME - 9].rstrip('-')}-{digest}"


def labels_for(req: LaunchRequest) -> dict[str, str]:
    """The identity labels every object and pod of this attempt carries."""
    return {MANAGED_BY: MANAGER, LABEL_JOB_ID: str(req.job_id), LABEL_ATTEMPT: str(req.attempt),
            LABEL_NAME: k8s_name(req.name)}


def is_managed(obj: Mapping[str, Any] | None) -> bool:
    """The object carries shardctl's managed-by label (so it may be adopted)."""
    labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
    return bool(labels.get(MANAGED_BY) == MANAGER)
