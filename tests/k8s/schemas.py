"""Validation of Kubernetes objects against the official schemas, plus the server-side rules no schema
encodes. Used by the fake API server on every create and by the rendering tests.

- Built-in kinds (ConfigMap, Secret, Service, Job, Pod): the JSON schemas `kubernetes-validate`
  ships for Kubernetes `K8S_VERSION`, strict variant (unknown fields are errors), all errors at once.
- CRDs (JobSet, PyTorchJob, Kueue kinds): the `openAPIV3Schema` of the CRD YAMLs in
  `../shared/k8s-schemas/` (copied verbatim from upstream), turned into JSON Schema in strict mode:
  `additionalProperties: false` wherever properties are listed and unknown fields are not preserved
  (what `fieldValidation=Strict` does); `x-kubernetes-int-or-string` and `nullable` honoured.
  CEL rules (`x-kubernetes-validations`) are not evaluated: for these CRDs they are immutability
  rules (`self == oldSelf`) that only matter on update, plus one JobSet rule checked by hand below.
  The CRD's `metadata` is checked against the built-in ObjectMeta schema, as the real server does.
- Semantic rules (`semantic_errors`): what the real API server's Go validation enforces beyond the
  schema: DNS-1123 names, label syntax, enums kept in Go code (completionMode, restartPolicy),
  podFailurePolicy needs restartPolicy Never, GPU requests equal to limits, volume mounts that name a
  volume, unique container names, PyTorchJob replica types.
"""

from __future__ import annotations

import copy
import json
import os
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from referencing import Registry, Resource

K8S_VERSION = "1.33"
ROOT = Path(__file__).resolve().parents[2]
SCHEMA_DIR = ROOT.parent / "shared" / "k8s-schemas"
EXAMPLES_DIR = ROOT.parent / "shared" / "k8s-examples"
BUILTIN = {("v1", "ConfigMap"), ("v1", "Secret"), ("v1", "Service"), ("v1", "Pod"), ("batch/v1", "Job")}
CRD_FILES = {
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): "jobset/jobset.x-k8s.io_jobsets.yaml",
    ("kubeflow.org/v1", "PyTorchJob"): "kubeflow-trainer-v1.9/kubeflow.org_pytorchjobs.yaml",
    ("kueue.x-k8s.io/v1beta2", "LocalQueue"): "kueue/kueue.x-k8s.io_localqueues.yaml",
    ("kueue.x-k8s.io/v1beta2", "ClusterQueue"): "kueue/kueue.x-k8s.io_clusterqueues.yaml",
    ("kueue.x-k8s.io/v1beta2", "ResourceFlavor"): "kueue/kueue.x-k8s.io_resourceflavors.yaml",
    ("kueue.x-k8s.io/v1beta2", "WorkloadPriorityClass"): "kueue/kueue.x-k8s.io_workloadpriorityclasses.yaml",
}


def require_crd_schemas() -> Path:
    """The CRD schema directory; skip the test (fail under CI) when it is absent."""
    if (SCHEMA_DIR / "jobset").is_dir():
        return SCHEMA_DIR
    if os.environ.get("CI"):
        pytest.fail(f"CRD schemas missing at {SCHEMA_DIR}: CI must validate against them")
    pytest.skip(f"CRD schemas not found at {SCHEMA_DIR} (the shared k8s-schemas directory)")


def _kv_dir() -> Path:
    base = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    return base / f"v{K8S_VERSION}.0-local-strict"


@cache
def _builtin_registry() -> Registry:
    defs = json.loads((_kv_dir() / "_definitions.json").read_text())
    return Resource.from_contents(defs) @ Registry()  # type: ignore[no-any-return]


@cache
def _builtin_validator(api_version: str, kind: str) -> jsonschema.Draft202012Validator:
    group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    schema = json.loads((_kv_dir() / f"{kind.lower()}-{group}.json").read_text())
    return jsonschema.Draft202012Validator(schema, registry=_builtin_registry())


def _object_meta_validator() -> jsonschema.Draft202012Validator:
    ref = {"$ref": "https://kubernetes.io/api/_definitions.json#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}
    return jsonschema.Draft202012Validator(ref, registry=_builtin_registry())


def openapi_to_jsonschema(node: Any, *, strict: bool = True) -> Any:
    """A CRD openAPIV3Schema node as JSON Schema (strict: unknown fields are errors)."""
    if isinstance(node, list):
        return [openapi_to_jsonschema(n, strict=strict) for n in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    preserve = bool(node.get("x-kubernetes-preserve-unknown-fields"))
    for key, value in node.items():
        if key in ("properties", "patternProperties"):
            out[key] = {k: openapi_to_jsonschema(v, strict=strict) for k, v in value.items()}
        elif key in ("items", "additionalProperties", "not") or key in ("anyOf", "allOf", "oneOf"):
            out[key] = openapi_to_jsonschema(value, strict=strict)
        elif key.startswith("x-kubernetes-") or key in ("description", "default", "example", "format"):
            continue
        else:
            out[key] = value
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    out.pop("nullable", None)
    if strict and "properties" in node and not preserve and "additionalProperties" not in node:
        out["additionalProperties"] = False
    return out


@cache
def _crd_validator(api_version: str, kind: str) -> jsonschema.Draft7Validator:
    path = SCHEMA_DIR / CRD_FILES[(api_version, kind)]
    crd = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    version = api_version.split("/")[1]
    entry = next(v for v in crd["spec"]["versions"] if v["name"] == version)
    schema = openapi_to_jsonschema(copy.deepcopy(entry["schema"]["openAPIV3Schema"]))
    schema.setdefault("properties", {})["metadata"] = {"type": "object"}  # checked as ObjectMeta separately
    return jsonschema.Draft7Validator(schema)


def is_known(api_version: str, kind: str) -> bool:
    return (api_version, kind) in BUILTIN or (api_version, kind) in CRD_FILES


def schema_errors(obj: dict[str, Any]) -> list[dict[str, str]]:
    """Every schema error of `obj` as Kubernetes `StatusCause`s (reason, field, message)."""
    api_version, kind = obj.get("apiVersion", ""), obj.get("kind", "")
    if (api_version, kind) in BUILTIN:
        errors: Iterator[jsonschema.ValidationError] = _builtin_validator(api_version, kind).iter_errors(obj)
    elif (api_version, kind) in CRD_FILES:
        require = SCHEMA_DIR / CRD_FILES[(api_version, kind)]
        if not require.exists():
            raise FileNotFoundError(f"CRD schema {require} missing")
        crd_errors = list(_crd_validator(api_version, kind).iter_errors(obj))
        meta_errors = list(_object_meta_validator().iter_errors(obj.get("metadata") or {}))
        for err in meta_errors:
            err.path.appendleft("metadata")
        errors = iter([*crd_errors, *meta_errors])
    else:
        return [{"reason": "FieldValueNotSupported", "field": "kind",
                 "message": f"no schema for {kind} {api_version}"}]
    causes = []
    for err in sorted(errors, key=lambda e: list(map(str, e.absolute_path))):
        field = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in err.absolute_path)
        causes.append({"reason": "FieldValueInvalid", "field": field.replace(".[", "["), "message": err.message})
    return causes


# -- semantic rules (Go validation in the real API server) ---------------------------------------

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[KMGTPE]i?|[munk])?$")
LABEL_NAMED = {"Service", "Job", "JobSet", "PyTorchJob", "Pod"}


def _label_key_ok(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not DNS_SUBDOMAIN.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(LABEL_NAME.match(name))


def _meta_errors(meta: dict[str, Any], field: str, kind: str, *, top: bool) -> Iterator[tuple[str, str]]:
    if top:
        name = meta.get("name")
        if not name:
            yield f"{field}.name", "name or generateName is required"
        elif kind in LABEL_NAMED and (len(name) > 63 or not DNS_LABEL.match(name)):
            yield f"{field}.name", f"{name!r}: a lowercase RFC 1123 label must consist of lower case alphanumeric" \
                                   " characters or '-', and must start and end with an alphanumeric character"
        elif len(name) > 253 or not DNS_SUBDOMAIN.match(name):
            yield f"{field}.name", f"{name!r}: a lowercase RFC 1123 subdomain is required"
    for key, value in (meta.get("labels") or {}).items():
        if not _label_key_ok(key):
            yield f"{field}.labels", f"{key!r}: invalid label key"
        if not isinstance(value, str) or len(value) > 63 or not LABEL_VALUE.match(value):
            yield f"{field}.labels", f"{value!r}: invalid label value for {key}"
    for key in meta.get("annotations") or {}:
        if not _label_key_ok(key):
            yield f"{field}.annotations", f"{key!r}: invalid annotation key"


def _quantity(value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return str(value)
    return value if isinstance(value, str) and QUANTITY.match(value) else None


def _pod_spec_errors(spec: dict[str, Any], field: str, *, job: bool) -> Iterator[tuple[str, str]]:
    restart = spec.get("restartPolicy", "Always")
    allowed = ("OnFailure", "Never") if job else ("Always", "OnFailure", "Never")
    if restart not in allowed:
        yield f"{field}.restartPolicy", f"Unsupported value: {restart!r}: supported values: {list(allowed)}"
    volumes = {v.get("name") for v in spec.get("volumes") or []}
    for v in spec.get("volumes") or []:
        if not v.get("name") or not DNS_LABEL.match(v["name"]):
            yield f"{field}.volumes", f"invalid volume name {v.get('name')!r}"
    seen: set[str] = set()
    for i, c in enumerate([*(spec.get("initContainers") or []), *(spec.get("containers") or [])]):
        cf = f"{field}.containers[{i}]"
        name = c.get("name", "")
        if not DNS_LABEL.match(name or ""):
            yield f"{cf}.name", f"invalid container name {name!r}"
        if name in seen:
            yield f"{cf}.name", f"Duplicate value: {name!r}"
        seen.add(name)
        if not c.get("image"):
            yield f"{cf}.image", "Required value"
        for m in c.get("volumeMounts") or []:
            if m.get("name") not in volumes:
                yield f"{cf}.volumeMounts", f"Not found: {m.get('name')!r} (no volume of that name)"
        for e in c.get("env") or []:
            if not ENV_NAME.match(e.get("name", "")):
                yield f"{cf}.env", f"invalid env name {e.get('name')!r}"
        policy = c.get("terminationMessagePolicy")
        if policy is not None and policy not in ("File", "FallbackToLogsOnError"):
            yield f"{cf}.terminationMessagePolicy", f"Unsupported value: {policy!r}"
        res = c.get("resources") or {}
        limits, requests = res.get("limits") or {}, res.get("requests") or {}
        for part, values in (("limits", limits), ("requests", requests)):
            for key, value in values.items():
                if _quantity(value) is None:
                    yield f"{cf}.resources.{part}[{key}]", f"invalid quantity {value!r}"
        for key, value in requests.items():
            if "/" in key and not key.startswith("kubernetes.io/"):  # an extended resource (nvidia.com/gpu)
                if key not in limits:
                    yield f"{cf}.resources.requests[{key}]", "extended resources need a limit"
                elif str(limits[key]) != str(value):
                    yield f"{cf}.resources.requests[{key}]", f"must be equal to {key} limit of {limits[key]}"
    for t in spec.get("tolerations") or []:
        if t.get("operator", "Equal") not in ("Equal", "Exists"):
            yield f"{field}.tolerations", f"Unsupported operator {t.get('operator')!r}"
        if t.get("effect") not in (None, "", "NoSchedule", "PreferNoSchedule", "NoExecute"):
            yield f"{field}.tolerations", f"Unsupported effect {t.get('effect')!r}"
        if t.get("operator") == "Exists" and t.get("value"):
            yield f"{field}.tolerations", "value must be empty when operator is Exists"
    for key, value in (spec.get("nodeSelector") or {}).items():
        if not _label_key_ok(key) or not LABEL_VALUE.match(str(value)):
            yield f"{field}.nodeSelector", f"invalid node selector {key}={value}"
    for key in ("hostname", "subdomain"):
        if spec.get(key) and not DNS_LABEL.match(spec[key]):
            yield f"{field}.{key}", f"{spec[key]!r} is not a DNS-1123 label"


def _template_errors(tmpl: dict[str, Any], field: str, *, job: bool) -> Iterator[tuple[str, str]]:
    yield from _meta_errors(tmpl.get("metadata") or {}, f"{field}.metadata", "PodTemplate", top=False)
    yield from _pod_spec_errors(tmpl.get("spec") or {}, f"{field}.spec", job=job)


def _job_spec_errors(spec: dict[str, Any], field: str) -> Iterator[tuple[str, str]]:
    mode = spec.get("completionMode", "NonIndexed")
    if mode not in ("NonIndexed", "Indexed"):
        yield f"{field}.completionMode", f"Unsupported value: {mode!r}: supported values: NonIndexed, Indexed"
    if mode == "Indexed" and spec.get("completions") is None:
        yield f"{field}.completions", "Required value: when completion mode is Indexed"
    for key in ("completions", "parallelism", "backoffLimit"):
        if isinstance(spec.get(key), int) and spec[key] < 0:
            yield f"{field}.{key}", "must be greater than or equal to 0"
    tmpl = spec.get("template") or {}
    if spec.get("podFailurePolicy") and (tmpl.get("spec") or {}).get("restartPolicy") != "Never":
        yield f"{field}.template.spec.restartPolicy", "Invalid value: only Never is supported with podFailurePolicy"
    for i, rule in enumerate((spec.get("podFailurePolicy") or {}).get("rules") or []):
        if rule.get("action") not in ("FailJob", "FailIndex", "Ignore", "Count"):
            yield f"{field}.podFailurePolicy.rules[{i}].action", f"Unsupported value: {rule.get('action')!r}"
        codes = rule.get("onExitCodes")
        if codes and codes.get("operator") not in ("In", "NotIn"):
            yield f"{field}.podFailurePolicy.rules[{i}].onExitCodes.operator", "Unsupported value"
    yield from _template_errors(tmpl, f"{field}.template", job=True)


def semantic_errors(obj: dict[str, Any]) -> list[dict[str, str]]:
    """The real API server's rules that the schemas do not express, as StatusCauses."""
    kind = obj.get("kind", "")
    out = list(_meta_errors(obj.get("metadata") or {}, "metadata", kind, top=True))
    spec = obj.get("spec") or {}
    if kind == "Job":
        out += _job_spec_errors(spec, "spec")
    elif kind == "Pod":
        out += _pod_spec_errors(spec, "spec", job=False)
    elif kind == "JobSet":
        names = [rj.get("name") for rj in spec.get("replicatedJobs") or []]
        if len(set(names)) != len(names):
            out.append(("spec.replicatedJobs", "replicatedJob names must be unique"))
        for i, rj in enumerate(spec.get("replicatedJobs") or []):
            field = f"spec.replicatedJobs[{i}]"
            if not DNS_LABEL.match(rj.get("name") or ""):
                out.append((f"{field}.name", "must be a DNS-1123 label"))
            # webhook: the longest pod hostname <jobset>-<rjob>-<jobIndex>-<podIndex> must be a DNS label
            completions = ((rj.get("template") or {}).get("spec") or {}).get("completions") or 1
            host = f"{obj['metadata'].get('name', '')}-{rj.get('name')}-{rj.get('replicas', 1) - 1}-{completions - 1}"
            if len(host) > 63:
                out.append((f"{field}.name", f"pod hostname {host!r} would exceed 63 characters"))
            out += _job_spec_errors((rj.get("template") or {}).get("spec") or {}, f"{field}.template.spec")
    elif kind == "PyTorchJob":
        for rtype, replica in (spec.get("pytorchReplicaSpecs") or {}).items():
            field = f"spec.pytorchReplicaSpecs[{rtype}]"
            if rtype not in ("Master", "Worker"):
                out.append((field, f"Unsupported replica type {rtype!r}: Master, Worker"))
            if rtype == "Master" and replica.get("replicas", 1) != 1:
                out.append((f"{field}.replicas", "must be 1 for Master"))
            if replica.get("restartPolicy") not in (None, "Always", "OnFailure", "Never", "ExitCode"):
                out.append((f"{field}.restartPolicy", f"Unsupported value {replica.get('restartPolicy')!r}"))
            tmpl = replica.get("template") or {}
            containers = [c.get("name") for c in (tmpl.get("spec") or {}).get("containers") or []]
            if "pytorch" not in containers:
                out.append((f"{field}.template.spec.containers", "one container must be named 'pytorch'"))
            out += _template_errors(tmpl, f"{field}.template", job=False)
    elif kind == "Service":
        ip = spec.get("clusterIP")
        if ip not in (None, "", "None") and not re.match(r"^[0-9.:a-fA-F]+$", str(ip)):
            out.append(("spec.clusterIP", f"invalid clusterIP {ip!r}"))
        for i, port in enumerate(spec.get("ports") or []):
            if port.get("name") and not DNS_LABEL.match(port["name"]):
                out.append((f"spec.ports[{i}].name", "must be a DNS-1123 label"))
    return [{"reason": "FieldValueInvalid", "field": field, "message": message} for field, message in out]


def validate(obj: dict[str, Any]) -> list[dict[str, str]]:
    """Schema errors then semantic errors; empty when the object is valid."""
    return schema_errors(obj) + semantic_errors(obj)


def load_yaml_documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]
