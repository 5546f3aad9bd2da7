"""A rendered pod's environment, resolved as the kubelet would, for running the chart's processes in
a test: literal values as they are; `secretKeyRef`s from the release's rendered Secrets, or from
`stand_ins` for Secrets the operator brings (existingSecret); mount paths moved under a local folder
(a ConfigMap's files written there, emptyDirs made empty); and a kubeconfig that points at the fake API
server in place of the in-cluster service account."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.chart import env_of, find, one, pod_spec


def kubeconfig(path: Path, host: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": host}}],
        "users": [{"name": "sa", "user": {"token": "not-a-real-token"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "sa"}}]}))
    return path


def _secret_value(objs: list[dict[str, Any]], ref: dict[str, str]) -> str | None:
    for secret in find(objs, "Secret", ref["name"]):
        if ref["key"] in (secret.get("stringData") or {}):
            return str(secret["stringData"][ref["key"]])
        if ref["key"] in (secret.get("data") or {}):
            return base64.b64decode(secret["data"][ref["key"]]).decode()
    return None


def container_environment(objs: list[dict[str, Any]], kind: str, name: str, *, root: Path,
                          kube: Path | None = None, stand_ins: dict[str, str] | None = None,
                          container: int = 0) -> dict[str, str]:
    """The environment of container `container` of the rendered `kind`/`name`, resolved."""
    spec = pod_spec(one(objs, kind, name))
    c = spec["containers"][container]
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    mounts: dict[str, Path] = {}
    for mount in c.get("volumeMounts", []):
        local = root / mount["name"]
        local.mkdir(parents=True, exist_ok=True)
        source = volumes[mount["name"]]
        if "configMap" in source:
            for key, text in one(objs, "ConfigMap", source["configMap"]["name"])["data"].items():
                (local / key).write_text(text)
        mounts[mount["mountPath"]] = local
    out: dict[str, str] = {}
    for var, value in env_of(c).items():
        if isinstance(value, dict):
            ref = value["secretKeyRef"]
            resolved = _secret_value(objs, ref)
            if resolved is None:
                assert stand_ins and var in stand_ins, f"{var}: Secret {ref} is not rendered and has no stand-in"
                resolved = stand_ins[var]
            out[var] = resolved
            continue
        for mount_path, local in mounts.items():
            if value == mount_path or value.startswith(mount_path + "/"):
                value = str(local) + value[len(mount_path):]
        out[var] = value
    if kube is not None:
        out["SHARDCTL_KUBECONFIG"] = str(kube)  # stands in for the in-cluster service account
    return out
