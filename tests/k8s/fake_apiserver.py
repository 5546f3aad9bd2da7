"""A project-owned fake Kubernetes API server on 127.0.0.1, for the real `kubernetes` client.

What it serves (HTTP/1.0, JSON, no auth):

- discovery, as `kubernetes.dynamic.DynamicClient` reads it: `/version`, `/api`, `/api/v1`, `/apis`,
  `/apis/<group>/<version>` (`APIResourceList`s with kind, name, namespaced, verbs, and the
  `pods/log` subresource); JobSet and PyTorchJob only when enabled: `FakeApiServer(jobset=False)` is
  a cluster without the JobSet controller (absent from `/apis`, 404 on its group version);
- namespaced create (POST), get, list (label selectors: `k=v`, `k==v`, `k!=v`, `k in (..)`,
  `k notin (..)`, `k`, `!k`), delete (with `propagationPolicy`), merge-patch (PATCH) for
  ConfigMap, Secret, Service, Pod, batch/v1 Job, JobSet, PyTorchJob; pod logs (`.../pods/<p>/log`);
- real-server answers: 201 with uid/resourceVersion/creationTimestamp/generation, 409 AlreadyExists,
  404 NotFound, 422 Invalid (every cause listed), 400 BadRequest — all as `Status` objects;
- validation of EVERY created object (`tests.k8s.schemas.validate`): built-ins against the
  kubernetes-validate schemas (strict), CRDs against the official CRD openAPIV3Schema (strict), plus
  the server's semantic rules. Pods it makes itself (`make_pods`) are validated the same way.

No controllers run. Tests script the world through the Python API: `make_pods` (what the JobSet/Job/
Kubeflow controllers would create from the stored template), `set_pod`, `set_condition`,
`set_status`, `set_log`/`append_log` (timestamped pod log lines), `go_down`/`come_back` (connection
refused), `fail_status`/`fail_paths` (scripted error answers), and read `requests`.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import secrets
import threading
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.k8s.schemas import validate

COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


@dataclass(frozen=True)
class Resource:
    group: str  # "" for the core group
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


CORE = [Resource("", "v1", "configmaps", "ConfigMap"), Resource("", "v1", "secrets", "Secret"),
        Resource("", "v1", "services", "Service"), Resource("", "v1", "pods", "Pod")]
BATCH = Resource("batch", "v1", "jobs", "Job")
JOBSET = Resource("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet")
PYTORCHJOB = Resource("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob")
BUILTIN_KINDS = {"ConfigMap", "Secret", "Service", "Pod", "Job"}
#: What the fake implements on every resource, and the subresources it serves (as discovery says).
VERBS = ("create", "delete", "get", "list", "patch")
SUBRESOURCES: dict[str, dict[str, tuple[str, ...]]] = {"pods": {"log": ("get",)}}
VERSION = {"major": "1", "minor": "33", "gitVersion": "v1.33.0-shardctl-fake", "gitCommit": "0" * 40,
           "gitTreeState": "clean", "buildDate": "2025-04-23T00:00:00Z", "goVersion": "go1.24.0", "compiler": "gc",
           "platform": "linux/amd64"}


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_body(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {},
                            "status": "Success" if code < 400 else "Failure", "message": message,
                            "reason": reason, "code": code}
    if details:
        body["details"] = details
    return body


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.body = status_body(code, reason, message, details)
        self.code = code


# -- label selectors -------------------------------------------------------------------------------

_TERM = re.compile(r"^\s*(?P<neg>!)?\s*(?P<key>[A-Za-z0-9./_-]+)\s*(?:(?P<op>==|=|!=)\s*(?P<val>[A-Za-z0-9._-]*)"
                   r"|\s+(?P<setop>in|notin)\s*\((?P<vals>[^)]*)\))?\s*$")


def parse_selector(selector: str) -> list[tuple[str, str, set[str]]]:
    """`k=v,k!=v,k in (a,b),k notin (a),k,!k` as (key, op, values) terms; ValueError if malformed."""
    terms: list[tuple[str, str, set[str]]] = []
    depth, start = 0, 0
    parts: list[str] = []
    for i, ch in enumerate(selector):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(selector[start:i])
            start = i + 1
    parts.append(selector[start:])
    for part in parts:
        if not part.strip():
            continue
        m = _TERM.match(part)
        if m is None:
            raise ValueError(f"unable to parse requirement: {part!r}")
        key = m["key"]
        if m["neg"]:
            if m["op"] or m["setop"]:
                raise ValueError(f"unable to parse requirement: {part!r}")
            terms.append((key, "!exists", set()))
        elif m["op"]:
            terms.append((key, "!=" if m["op"] == "!=" else "=", {m["val"]}))
        elif m["setop"]:
            terms.append((key, m["setop"], {v.strip() for v in m["vals"].split(",") if v.strip()}))
        else:
            terms.append((key, "exists", set()))
    return terms


def selector_matches(terms: list[tuple[str, str, set[str]]], labels: dict[str, str]) -> bool:
    for key, op, values in terms:
        present, value = key in labels, labels.get(key)
        ok = {"=": present and value in values, "in": present and value in values,
              "!=": not present or value not in values, "notin": not present or value not in values,
              "exists": present, "!exists": not present}[op]
        if not ok:
            return False
    return True


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


# -- the server ------------------------------------------------------------------------------------

class FakeApiServer:
    """Start with `FakeApiServer().start()` (or as a context manager); point a client at `.host`."""

    def __init__(self, *, jobset: bool = True, pytorchjob: bool = True, hold_foreground: bool = False) -> None:
        self.resources: dict[tuple[str, str, str], Resource] = {}
        for res in [*CORE, BATCH] + ([JOBSET] if jobset else []) + ([PYTORCHJOB] if pytorchjob else []):
            self.resources[(res.group, res.version, res.plural)] = res
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}  # (plural, ns, name) -> object
        self.logs: dict[tuple[str, str], list[tuple[datetime, str]]] = {}  # (ns, pod) -> timestamped lines
        self.requests: list[tuple[str, str, dict[str, list[str]]]] = []
        self.deletions: list[tuple[str, str, str, str | None]] = []  # plural, ns, name, propagationPolicy
        self.hold_foreground = hold_foreground
        self.fail_status: int | None = None  # answer every request with this status (e.g. 503)
        self.fail_paths: dict[str, int] = {}  # answer requests for these exact paths with these statuses
        self._rv = 0
        self._lock = threading.RLock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # -- lifecycle -------------------------------------------------------------------------------
    @property
    def host(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeApiServer:
        server = self

        class Handler(_Handler):
            fake = server

        httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        httpd.daemon_threads = True
        self._httpd = httpd
        self.port = httpd.server_address[1]
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02},
                                        name="fake-apiserver", daemon=True)
        self._thread.start()
        return self

    def go_down(self) -> None:
        """Stop listening: clients get 'connection refused' until `come_back()`."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def come_back(self) -> None:
        self.start()

    stop = go_down

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.go_down()

    # -- request accounting ----------------------------------------------------------------------
    def count(self, method: str, path_regex: str = "") -> int:
        with self._lock:
            return sum(1 for m, p, _ in self.requests if m == method and re.search(path_regex, p))

    def reset_requests(self) -> None:
        with self._lock:
            self.requests.clear()

    # -- scripted world --------------------------------------------------------------------------
    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def get(self, plural: str, ns: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            obj = self.objects.get((plural, ns, name))
            return copy.deepcopy(obj) if obj else None

    def names(self, plural: str, ns: str | None = None) -> list[str]:
        with self._lock:
            return sorted(n for (p, s, n) in self.objects if p == plural and (ns is None or s == ns))

    def _update(self, plural: str, ns: str, name: str, fn: Any) -> dict[str, Any]:
        with self._lock:
            obj = self.objects.get((plural, ns, name))
            if obj is None:
                raise KeyError(f"{plural}/{ns}/{name} does not exist")
            fn(obj)
            obj["metadata"]["resourceVersion"] = self._next_rv()
            return copy.deepcopy(obj)

    def set_status(self, plural: str, ns: str, name: str, **fields: Any) -> None:
        """Merge `fields` into `.status` (e.g. restarts=1, ready=2, replicatedJobsStatus=[...])."""
        self._update(plural, ns, name, lambda o: o.setdefault("status", {}).update(fields))

    def set_condition(self, plural: str, ns: str, name: str, ctype: str, status: str = "True",
                      reason: str = "", message: str = "") -> None:
        """Set (or replace) the condition `ctype`, as the JobSet/Job/Kubeflow controller would."""
        def apply(obj: dict[str, Any]) -> None:
            conds = [c for c in obj.setdefault("status", {}).get("conditions", []) if c["type"] != ctype]
            conds.append({"type": ctype, "status": status, "reason": reason, "message": message,
                          "lastTransitionTime": now_iso(), "lastProbeTime": now_iso()})
            obj["status"]["conditions"] = conds
        self._update(plural, ns, name, apply)

    def make_pods(self, plural: str, ns: str, name: str, *, restart_attempt: int = 0) -> list[str]:
        """Create the pods the controller of this workload would create from its stored template, each
        validated as a Pod. JobSet: `<js>-<rjob>-<j>-<i>-<rand>`; Job: `<job>-<i>-<rand>`; PyTorchJob:
        `<job>-master-0`, `<job>-worker-<i>` (with the env the Kubeflow operator injects)."""
        obj = self.get(plural, ns, name)
        if obj is None:
            raise KeyError(f"{plural}/{ns}/{name} does not exist")
        owner = {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": name,
                 "uid": obj["metadata"]["uid"], "controller": True}
        made: list[tuple[str, dict[str, Any], dict[str, str], dict[str, str], dict[str, Any]]] = []
        if obj["kind"] == "JobSet":
            subdomain = obj["spec"].get("network", {}).get("subdomain") or name
            for rj in obj["spec"]["replicatedJobs"]:
                for j in range(rj.get("replicas", 1)):
                    job_spec = rj["template"]["spec"]
                    job_name = f"{name}-{rj['name']}-{j}"
                    for i in range(job_spec.get("completions", 1)):
                        labels = {"jobset.sigs.k8s.io/jobset-name": name,
                                  "jobset.sigs.k8s.io/replicatedjob-name": rj["name"],
                                  "jobset.sigs.k8s.io/job-index": str(j),
                                  "jobset.sigs.k8s.io/restart-attempt": str(restart_attempt),
                                  "job-name": job_name, "batch.kubernetes.io/job-name": job_name,
                                  COMPLETION_INDEX: str(i)}
                        spec_extra = {"hostname": f"{job_name}-{i}", "subdomain": subdomain}
                        made.append((f"{job_name}-{i}-{secrets.token_hex(3)[:5]}", job_spec["template"], labels,
                                     {COMPLETION_INDEX: str(i)}, spec_extra))
        elif obj["kind"] == "Job":
            for i in range(obj["spec"].get("completions", 1)):
                labels = {"job-name": name, "batch.kubernetes.io/job-name": name, COMPLETION_INDEX: str(i)}
                made.append((f"{name}-{i}-{secrets.token_hex(3)[:5]}", obj["spec"]["template"], labels,
                             {COMPLETION_INDEX: str(i)}, {"hostname": f"{name}-{i}"}))
        elif obj["kind"] == "PyTorchJob":
            replicas = obj["spec"]["pytorchReplicaSpecs"]
            total = sum(r.get("replicas", 1) for r in replicas.values())
            for rtype in ("Master", "Worker"):
                for i in range(replicas.get(rtype, {}).get("replicas", 0)):
                    rank = i if rtype == "Master" else i + 1
                    labels = {"training.kubeflow.org/job-name": name,
                              "training.kubeflow.org/replica-type": rtype.lower(),
                              "training.kubeflow.org/replica-index": str(i),
                              "training.kubeflow.org/operator-name": "pytorchjob-controller"}
                    env = {"PYTHONUNBUFFERED": "1", "MASTER_ADDR": f"{name}-master-0", "MASTER_PORT": "29500",
                           "RANK": str(rank), "PET_NODE_RANK": str(rank), "PET_NNODES": str(total),
                           "WORLD_SIZE": str(total)}
                    made.append((f"{name}-{rtype.lower()}-{i}", replicas[rtype]["template"], labels, {},
                                 {"__env": env}))
        names = []
        for pod_name, template, labels, pod_annotations, extra in made:
            spec = copy.deepcopy(template.get("spec") or {})
            env_extra = extra.pop("__env", None)
            spec.update(extra)
            for c in spec.get("containers", []):
                if COMPLETION_INDEX in pod_annotations:  # what the Job controller injects
                    c.setdefault("env", []).append({"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {
                        "fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}})
                for k, v in (env_extra or {}).items():
                    c.setdefault("env", []).append({"name": k, "value": v})
            meta = copy.deepcopy(template.get("metadata") or {})
            meta["name"], meta["namespace"] = pod_name, ns
            meta["labels"] = {**(meta.get("labels") or {}), **labels}
            meta["annotations"] = {**(meta.get("annotations") or {}), **pod_annotations}
            meta["ownerReferences"] = [owner]
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec,
                   "status": {"phase": "Pending", "conditions": []}}
            self._store("pods", ns, pod)
            names.append(pod_name)
        return names

    def pods_of(self, ns: str, label: str, value: str) -> list[str]:
        with self._lock:
            return sorted(n for (p, s, n), o in self.objects.items() if p == "pods" and s == ns
                          and (o["metadata"].get("labels") or {}).get(label) == value)

    def set_pod(self, ns: str, name: str, *, phase: str | None = None, node: str | None = None,
                exit_code: int | None = None, reason: str | None = None, message: str | None = None,
                disruption: str | None = None, unschedulable_since: str | None = None,
                termination_message: str | None = None) -> None:
        """Move a pod the way the scheduler/kubelet would: `phase` Running/Succeeded/Failed, the node,
        a container exit code (and reason such as OOMKilled), a pod-level `reason` (Evicted), a
        DisruptionTarget condition (`disruption`: PreemptionByScheduler, DeletionByTaintManager...),
        or PodScheduled=False/Unschedulable since an ISO time."""
        def apply(pod: dict[str, Any]) -> None:
            st = pod.setdefault("status", {})
            conds: list[dict[str, Any]] = st.setdefault("conditions", [])
            container = pod["spec"]["containers"][0]["name"]
            if node is not None:
                pod["spec"]["nodeName"] = node
                st["hostIP"] = "10.0.0.1"
            if phase is not None:
                st["phase"] = phase
            if phase == "Running":
                st["containerStatuses"] = [{"name": container, "ready": True, "restartCount": 0,
                                            "image": pod["spec"]["containers"][0]["image"], "imageID": "",
                                            "state": {"running": {"startedAt": now_iso()}}}]
            if exit_code is not None or phase in ("Succeeded", "Failed"):
                code = exit_code if exit_code is not None else (0 if phase == "Succeeded" else 1)
                term = {"exitCode": code, "reason": (reason if reason and reason != "Evicted" else
                                                     ("Completed" if code == 0 else "Error")),
                        "startedAt": now_iso(), "finishedAt": now_iso()}
                if termination_message:
                    term["message"] = termination_message
                st["containerStatuses"] = [{"name": container, "ready": False, "restartCount": 0,
                                            "image": pod["spec"]["containers"][0]["image"], "imageID": "",
                                            "state": {"terminated": term}}]
            if reason == "Evicted":
                st["reason"], st["message"] = "Evicted", message or "The node was low on resource: memory."
            if disruption is not None:
                conds.append({"type": "DisruptionTarget", "status": "True", "reason": disruption,
                              "message": message or disruption, "lastTransitionTime": now_iso()})
            if unschedulable_since is not None:
                conds[:] = [c for c in conds if c["type"] != "PodScheduled"]
                conds.append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                              "message": message or "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.",
                              "lastTransitionTime": unschedulable_since})
        self._update("pods", ns, name, apply)

    def set_log(self, ns: str, pod: str, text: str, at: datetime | None = None) -> None:
        """Replace the pod's log with the lines of `text`, all written at `at` (default: now)."""
        with self._lock:
            self.logs[(ns, pod)] = []
        self.append_log(ns, pod, text, at)

    def append_log(self, ns: str, pod: str, text: str, at: datetime | None = None) -> None:
        """Add the lines of `text` to the pod's log (a container writing them), each stamped `at`
        (default: now), as the kubelet stamps each line it reads."""
        when = at or datetime.now(UTC)
        with self._lock:
            self.logs.setdefault((ns, pod), []).extend((when, line) for line in text.splitlines())

    def log_text(self, ns: str, pod: str, query: dict[str, list[str]]) -> str:
        """The pod log as the API server answers `GET .../log` with `query`: `timestamps` (RFC 3339 with
        nanoseconds before each line), `sinceTime` (RFC 3339, whole seconds: lines at or after it),
        `tailLines`, `limitBytes` (the answer cut at that many bytes, mid-line if need be)."""
        def first(key: str) -> str | None:
            return (query.get(key) or [None])[0]

        with self._lock:
            lines = list(self.logs.get((ns, pod), []))
        since = first("sinceTime")
        if since is not None:
            try:
                cutoff = datetime.strptime(since, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
            except ValueError as exc:
                raise ApiError(400, "BadRequest", f"sinceTime {since!r} is not RFC 3339 (seconds)") from exc
            lines = [(t, x) for t, x in lines if t >= cutoff]
        tail = first("tailLines")
        if tail is not None:
            lines = lines[-int(tail):] if int(tail) > 0 else []
        stamped = first("timestamps") == "true"
        text = "".join((t.strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z " if stamped else "") + x + "\n"
                       for t, x in lines)
        limit = first("limitBytes")
        if limit is not None:
            text = text.encode()[:int(limit)].decode(errors="ignore")
        return text

    # -- storage -------------------------------------------------------------------------------
    def _store(self, plural: str, ns: str, obj: dict[str, Any]) -> dict[str, Any]:
        causes = validate(obj)
        if causes:
            raise ApiError(422, "Invalid", f'{obj.get("kind")} "{obj.get("metadata", {}).get("name")}" is invalid: '
                           + "; ".join(f"{c['field']}: {c['message']}" for c in causes),
                           {"name": obj.get("metadata", {}).get("name"), "kind": obj.get("kind"),
                            "causes": causes})
        with self._lock:
            name = obj["metadata"]["name"]
            if (plural, ns, name) in self.objects:
                group = next((r.group for r in self.resources.values() if r.plural == plural), "")
                raise ApiError(409, "AlreadyExists", f'{plural}{"." + group if group else ""} "{name}" already exists',
                               {"name": name, "group": group, "kind": plural})
            stored = copy.deepcopy(obj)
            meta = stored["metadata"]
            meta.update(namespace=ns, uid=str(uuid.uuid4()), resourceVersion=self._next_rv(),
                        creationTimestamp=now_iso(), generation=1)
            if stored["kind"] == "Secret" and "stringData" in stored:
                data = stored.setdefault("data", {})
                for key, value in stored.pop("stringData").items():
                    data[key] = base64.b64encode(value.encode()).decode()
            if stored["kind"] == "Job":  # what the real server defaults
                uid = meta["uid"]
                stored["spec"]["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
                tl = stored["spec"]["template"].setdefault("metadata", {}).setdefault("labels", {})
                tl.update({"batch.kubernetes.io/controller-uid": uid, "controller-uid": uid,
                           "batch.kubernetes.io/job-name": name, "job-name": name})
            if stored["kind"] != "Pod":
                stored["status"] = {}
            self.objects[(plural, ns, name)] = stored
            return copy.deepcopy(stored)

    def _delete(self, plural: str, ns: str, name: str, policy: str | None) -> dict[str, Any]:
        with self._lock:
            obj = self.objects.get((plural, ns, name))
            if obj is None:
                raise ApiError(404, "NotFound", f'{plural} "{name}" not found', {"name": name, "kind": plural})
            self.deletions.append((plural, ns, name, policy))
            if policy == "Foreground" and self.hold_foreground and plural != "pods":
                meta = obj["metadata"]
                meta.setdefault("deletionTimestamp", now_iso())
                meta["finalizers"] = sorted({*meta.get("finalizers", []), "foregroundDeletion"})
                meta["resourceVersion"] = self._next_rv()
                return copy.deepcopy(obj)
            self._remove_tree(plural, ns, name)
            return status_body(200, "", "deleted", {"name": name, "kind": plural, "uid": obj["metadata"]["uid"]})

    def _remove_tree(self, plural: str, ns: str, name: str) -> None:
        obj = self.objects.pop((plural, ns, name))
        uid = obj["metadata"]["uid"]
        for key, other in list(self.objects.items()):  # garbage collection of dependents
            if key[1] == ns and key in self.objects and any(
                    ref.get("uid") == uid for ref in other["metadata"].get("ownerReferences") or []):
                self._remove_tree(*key)

    def finish_deletions(self) -> None:
        """What the garbage collector does for objects held by foregroundDeletion."""
        with self._lock:
            for key, obj in list(self.objects.items()):
                if key in self.objects and obj["metadata"].get("deletionTimestamp"):
                    self._remove_tree(*key)

    def _patch(self, plural: str, ns: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            obj = self.objects.get((plural, ns, name))
            if obj is None:
                raise ApiError(404, "NotFound", f'{plural} "{name}" not found', {"name": name, "kind": plural})
            merged = merge_patch(obj, patch)
            for fixed in ("uid", "name", "namespace", "creationTimestamp"):
                merged["metadata"][fixed] = obj["metadata"][fixed]
            check = {k: v for k, v in merged.items() if k != "status"}
            check["metadata"] = {k: v for k, v in merged["metadata"].items()
                                 if k not in ("uid", "resourceVersion", "creationTimestamp", "generation")}
            causes = validate(check)
            if causes:
                raise ApiError(422, "Invalid", f'{obj["kind"]} "{name}" is invalid', {"causes": causes})
            merged["metadata"]["resourceVersion"] = self._next_rv()
            self.objects[(plural, ns, name)] = merged
            return copy.deepcopy(merged)

    def _list(self, res: Resource, ns: str | None, selector: str | None) -> bytes:
        """The list answer, serialized while the lock is held: the stored objects are read, never
        copied (a deep copy of each was nine tenths of a 4,800-item list's time), and no later change
        can reach the answer."""
        try:
            terms = parse_selector(selector or "")
        except ValueError as exc:
            raise ApiError(400, "BadRequest", str(exc)) from exc
        builtin = res.kind in BUILTIN_KINDS  # the real server leaves kind/apiVersion off built-in list items
        with self._lock:
            items = [{k: v for k, v in o.items() if k not in ("kind", "apiVersion")} if builtin else o
                     for (p, s, _), o in sorted(self.objects.items())
                     if p == res.plural and (ns is None or s == ns)
                     and selector_matches(terms, o["metadata"].get("labels") or {})]
            return json.dumps({"apiVersion": res.api_version, "kind": f"{res.kind}List",
                               "metadata": {"resourceVersion": str(self._rv)}, "items": items}).encode()

    # -- discovery -------------------------------------------------------------------------------
    def discovery(self, path: str) -> dict[str, Any] | None:
        """The discovery documents `kubernetes.dynamic.DynamicClient` reads: `/version`, `/api`, `/apis`
        and one `APIResourceList` per served group version, listing exactly what this server
        implements (kinds, plurals, `namespaced`, verbs, and the `pods/log` subresource)."""
        if path == "/version":
            return dict(VERSION)
        if path == "/api":
            return {"kind": "APIVersions", "versions": ["v1"],
                    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}
        if path == "/apis":
            groups: dict[str, list[str]] = {}
            for res in self.resources.values():
                if res.group:
                    groups.setdefault(res.group, [])
                    if res.version not in groups[res.group]:
                        groups[res.group].append(res.version)
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
                 "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]}}
                for g, vs in sorted(groups.items())]}
        m = re.fullmatch(r"/api/(v1)|/apis/([^/]+)/([^/]+)", path)
        if not m:
            return None
        group, version = ("", "v1") if m[1] else (m[2], m[3])
        resources = [r for r in self.resources.values() if (r.group, r.version) == (group, version)]
        if not resources:
            return None
        listed: list[dict[str, Any]] = []
        for r in resources:
            listed.append({"name": r.plural, "singularName": r.kind.lower(), "namespaced": True, "kind": r.kind,
                           "verbs": list(VERBS)})
            listed.extend({"name": f"{r.plural}/{sub}", "singularName": "", "namespaced": True, "kind": r.kind,
                           "verbs": list(verbs)} for sub, verbs in SUBRESOURCES.get(r.plural, {}).items())
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": resources[0].api_version,
                "resources": listed}


_PATH = re.compile(r"^/(?:api/(?P<cv>v1)|apis/(?P<g>[^/]+)/(?P<v>[^/]+))/namespaces/(?P<ns>[^/]+)/(?P<plural>[^/]+)"
                   r"(?:/(?P<name>[^/]+)(?:/(?P<sub>log))?)?$")


class _Handler(BaseHTTPRequestHandler):
    fake: FakeApiServer
    protocol_version = "HTTP/1.0"  # one request per connection: go_down() really cuts clients off

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return

    def _send(self, code: int, body: Any, content_type: str = "application/json") -> None:
        if isinstance(body, bytes):  # already serialized (`_list`)
            data = body
        elif isinstance(body, str):
            data = body.encode()
        else:
            data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise ApiError(400, "BadRequest", f"body is not JSON: {exc}") from exc

    def _handle(self, method: str) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        with self.fake._lock:
            self.fake.requests.append((method, url.path, query))
        try:
            status = self.fake.fail_paths.get(url.path, self.fake.fail_status)
            if status is not None:
                raise ApiError(status, "ServiceUnavailable", "scripted failure")
            self._dispatch(method, url.path, query)
        except ApiError as exc:
            self._send(exc.code, exc.body)
        except Exception as exc:  # a bug in the fake must show up as such, not as a hang
            self._send(500, status_body(500, "InternalError", f"fake apiserver bug: {exc!r}"))

    def _dispatch(self, method: str, path: str, query: dict[str, list[str]]) -> None:
        fake = self.fake
        if method == "GET":
            disc = fake.discovery(path.rstrip("/"))
            if disc is not None:
                return self._send(200, disc)
        m = _PATH.match(path)
        res = None
        if m:
            group, version = ("", "v1") if m["cv"] else (m["g"], m["v"])
            res = fake.resources.get((group, version, m["plural"]))
        if m is None or res is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        ns, name, sub = m["ns"], m["name"], m["sub"]
        if sub == "log":
            if method != "GET" or res.plural != "pods":
                raise ApiError(405, "MethodNotAllowed", "only GET on pods/log")
            pod = fake.get("pods", ns, name)
            if pod is None:
                raise ApiError(404, "NotFound", f'pods "{name}" not found')
            container = (query.get("container") or [None])[0]
            names = [c["name"] for c in pod["spec"]["containers"]]
            if container is not None and container not in names:
                raise ApiError(400, "BadRequest", f"container {container} is not valid for pod {name}")
            return self._send(200, fake.log_text(ns, name, query), "text/plain")
        if method == "POST" and name is None:
            body = self._body()
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "the body of a create must be an object")
            if body.get("apiVersion") != res.api_version or body.get("kind") != res.kind:
                raise ApiError(400, "BadRequest", f"the API version in the data ({body.get('apiVersion')}) and kind "
                               f"({body.get('kind')}) do not match {res.api_version} {res.kind}")
            body_ns = (body.get("metadata") or {}).get("namespace")
            if body_ns not in (None, ns):
                raise ApiError(400, "BadRequest", "the namespace of the provided object does not match the "
                               "namespace sent on the request")
            if (query.get("dryRun") or [None])[0] == "All":
                causes = validate(body)
                if causes:
                    raise ApiError(422, "Invalid", "invalid", {"causes": causes})
                return self._send(201, body)
            return self._send(201, fake._store(res.plural, ns, body))
        if method == "GET" and name is None:
            if (query.get("fieldSelector") or [""])[0]:
                raise ApiError(400, "BadRequest", "the fake apiserver does not implement field selectors")
            return self._send(200, fake._list(res, ns, (query.get("labelSelector") or [None])[0]))
        if name is None:
            raise ApiError(405, "MethodNotAllowed", f"{method} on a collection")
        if method == "GET":
            obj = fake.get(res.plural, ns, name)
            if obj is None:
                raise ApiError(404, "NotFound", f'{res.plural} "{name}" not found', {"name": name,
                                                                                        "kind": res.plural})
            return self._send(200, obj)
        if method == "DELETE":
            body = self._body() or {}
            policy = body.get("propagationPolicy") or (query.get("propagationPolicy") or [None])[0]
            return self._send(200, fake._delete(res.plural, ns, name, policy))
        if method == "PATCH":
            ctype = self.headers.get("Content-Type", "")
            if "merge-patch" not in ctype:
                raise ApiError(415, "UnsupportedMediaType", f"the fake only implements merge-patch, not {ctype}")
            return self._send(200, fake._patch(res.plural, ns, name, self._body() or {}))
        raise ApiError(405, "MethodNotAllowed", method)

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def do_PATCH(self) -> None:
        self._handle("PATCH")
