"""The chart under test, rendered by the real Helm engine (`helm-python-sdk`, in process), and what the
tests need around it: the scenario values files, rendered objects as dicts, and validation of every
object (built-in kinds with `kubernetes-validate`, strict; the ServiceMonitor against the Prometheus
operator's CRD schema, strict)."""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema  # type: ignore[import-untyped]
import kubernetes_validate  # type: ignore[import-untyped]
import yaml

from tests.k8s.schemas import openapi_to_jsonschema

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "shardctl"
SCENARIOS = CHART / "ci"
GOLDEN = Path(__file__).parent / "golden"
K8S_VERSION = "1.33"
#: The Kubernetes versions every rendered object is validated against: the chart's kubeVersion floor, the
#: fake API server's version, the newest kubernetes-validate ships.
K8S_VERSIONS = ("1.27", "1.33", "1.37")
SERVICE_MONITOR_CRD = Path(__file__).parent / "schemas" / "monitoring.coreos.com_servicemonitors.yaml"
#: The chart's generated admin token, masked in goldens (it is random on every render without a cluster).
MASKED = "<generated>"


def scenario(name: str) -> dict[str, Any]:
    """The values of `helm/shardctl/ci/<name>-values.yaml`."""
    data = yaml.safe_load((SCENARIOS / f"{name}-values.yaml").read_text())
    return data if isinstance(data, dict) else {}


def scenario_names() -> list[str]:
    return sorted(p.name.removesuffix("-values.yaml") for p in SCENARIOS.glob("*-values.yaml"))


def render_raw(values: dict[str, Any] | None = None, *, name: str = "shardctl",
               namespace: str = "shardctl-system") -> dict[str, str]:
    """Template path -> rendered text, as `helm template` makes it (hooks and tests included)."""
    with helm.Chart.load(CHART) as chart:
        return chart.render(values=values, name=name, namespace=namespace, is_install=True)


def objects(rendered: dict[str, str]) -> list[dict[str, Any]]:
    """Every object of a render, in template order (NOTES.txt left out)."""
    out: list[dict[str, Any]] = []
    for path in sorted(rendered):
        if path.endswith("NOTES.txt"):
            continue
        out.extend(d for d in yaml.safe_load_all(rendered[path]) if d)
    return out


def render(values: dict[str, Any] | None = None, **kw: Any) -> list[dict[str, Any]]:
    return objects(render_raw(values, **kw))


def find(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = find(objs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {[o['metadata']['name'] for o in found]}"
    return found[0]


def lint(values: dict[str, Any] | None = None, namespace: str = "shardctl-system") -> list[str]:
    """`helm lint --strict`: every finding of warning severity or worse, as text."""
    report = helm.lint(CHART, values, strict=True, namespace=namespace)
    found = [f"{m['path']}: {m['error']}" for m in report["messages"] if m["severity"] >= 2]
    return found + list(report["errors"])


@cache
def _service_monitor_validator() -> jsonschema.Draft7Validator:
    crd = yaml.safe_load(SERVICE_MONITOR_CRD.read_text())
    entry = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    schema = openapi_to_jsonschema(copy.deepcopy(entry["schema"]["openAPIV3Schema"]))
    schema.setdefault("properties", {})["metadata"] = {"type": "object"}
    return jsonschema.Draft7Validator(schema)


def validation_errors(obj: dict[str, Any], version: str = K8S_VERSION) -> list[str]:
    """Why `obj` is not a valid object of its kind in Kubernetes `version` (empty when it is)."""
    where = f"{obj.get('kind')} {obj.get('metadata', {}).get('name')}"
    if obj.get("apiVersion") == "monitoring.coreos.com/v1" and obj.get("kind") == "ServiceMonitor":
        return [f"{where}: {'.'.join(map(str, e.absolute_path))}: {e.message}"
                for e in _service_monitor_validator().iter_errors(obj)]
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{where}: {'.'.join(map(str, exc.path))}: {exc.message}"]
    except kubernetes_validate.SchemaNotFoundError as exc:
        return [f"{where}: no schema: {exc}"]
    return []


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    """A container's env by name (value, or the valueFrom mapping)."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = obj["spec"]["template"]["spec"] if obj["kind"] != "Pod" else obj["spec"]
    return spec
