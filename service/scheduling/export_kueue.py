"""`shardctl export kueue`: the quota tree as Kueue objects (kueue.x-k8s.io/v1beta2).

Mapping (docs/scheduling.md):
- one `ResourceFlavor` per GPU kind of the Kubernetes pools, named by the first such pool's `flavor`
  (else the kind in lower case, e.g. `h100-sxm-80gb`); the resource is `nvidia.com/gpu` (`cpu` for
  a `cpu` pool);
- one `ClusterQueue` per team, named as the team: for every flavor `nominalQuota` = nominal,
  `borrowingLimit` / `lendingLimit` when set (a kind the team has no entry for: nominal 0, borrowing 0);
  `fairSharing.weight` = the team's weight; `cohortName` = its group, else the root cohort `shardctl`;
  preemption `reclaimWithinCohort: Any` when a Kubernetes pool may preempt, `withinClusterQueue:
  LowerPriority` when one is `lower_priority` (Kueue sets these per queue, shardctl per pool);
- `Cohort`s: `shardctl` (the root, holding as its own quota the pool capacity no team's nominal
  covers) and one per group with `parentName: shardctl`, so unused quota is lent in the group first;
- one `LocalQueue` per team in each namespace of the Kubernetes pools (`default` when unset), named as
  the team (`kueue_names.local_queue_name`; a Kueue-managed pool's workloads are labelled with it,
  and `SHARDCTL_KUBERNETES_QUEUES` maps team -> this name where no pool is declared);
- one `WorkloadPriorityClass` per priority band (`bands`), named by `kueue_names.priority_class_name`'s
  `band_name`.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from service.scheduling.bands import band_name, priority_bands
from service.scheduling.config_file import PoolsFile
from service.scheduling.kueue_names import local_queue_name
from service.scheduling.model import Pool, PreemptionPolicy

API = "kueue.x-k8s.io/v1beta2"
ROOT_COHORT = "shardctl"
GPU_RESOURCE = "nvidia.com/gpu"


def flavor_name(kind: str, pools: list[Pool]) -> str:
    for p in sorted(pools, key=lambda p: p.name):
        if p.gpu == kind and p.flavor:
            return p.flavor
    return re.sub(r"[^a-z0-9]+", "-", kind.lower()).strip("-") or "gpu"


def _quantity(value: float) -> int | str:
    return int(value) if float(value).is_integer() else f"{value:g}"


def render_kueue(pf: PoolsFile) -> list[dict[str, Any]]:
    """Every object, in apply order: flavors, cohorts, cluster queues, local queues, priority classes.
    Raises ValueError when no pool has backend kubernetes."""
    pools = [p for p in pf.pools if p.backend.value == "kubernetes"]
    if not pools:
        raise ValueError("pools: no pool has backend kubernetes; Kueue objects cover Kubernetes pools only")
    kinds = sorted({p.gpu for p in pools})
    capacity = {k: sum(p.gpus for p in pools if p.gpu == k) for k in kinds}
    flavors = {k: flavor_name(k, pools) for k in kinds}
    resource = {k: "cpu" if k == "cpu" else GPU_RESOURCE for k in kinds}
    out: list[dict[str, Any]] = [
        {"apiVersion": API, "kind": "ResourceFlavor", "metadata": {"name": flavors[k]}, "spec": {}}
        for k in kinds]
    nominal = {k: sum(q.flavors[k].nominal for q in pf.teams.values() if k in q.flavors) for k in kinds}
    root_spec: dict[str, Any] = {}
    groups = _resource_groups({k: max(0, capacity[k] - nominal[k]) for k in kinds}, flavors, resource)
    if any(max(0, capacity[k] - nominal[k]) for k in kinds):
        root_spec["resourceGroups"] = groups
    out.append({"apiVersion": API, "kind": "Cohort", "metadata": {"name": ROOT_COHORT}, "spec": root_spec})
    for group in sorted({q.group for q in pf.teams.values() if q.group}):
        out.append({"apiVersion": API, "kind": "Cohort", "metadata": {"name": group},
                    "spec": {"parentName": ROOT_COHORT}})
    preempts = any(p.preemption != PreemptionPolicy.NEVER for p in pools)
    lower = any(p.preemption == PreemptionPolicy.LOWER_PRIORITY for p in pools)
    for team in sorted(pf.teams):
        q = pf.teams[team]
        per_flavor = []
        for k in kinds:
            res: dict[str, Any] = {"name": resource[k]}
            fq = q.flavors.get(k)
            if fq is None:
                res.update(nominalQuota=0, borrowingLimit=0)
            else:
                res["nominalQuota"] = fq.nominal
                if fq.borrowing_limit is not None:
                    res["borrowingLimit"] = fq.borrowing_limit
                if fq.lending_limit is not None:
                    res["lendingLimit"] = min(fq.lending_limit, fq.nominal)
            per_flavor.append((k, res))
        spec: dict[str, Any] = {
            "cohortName": q.group or ROOT_COHORT,
            "namespaceSelector": {},
            "fairSharing": {"weight": _quantity(q.weight)},
            "preemption": {"reclaimWithinCohort": "Any" if preempts else "Never",
                           "withinClusterQueue": "LowerPriority" if lower else "Never"},
            "resourceGroups": _group_rows(per_flavor, flavors),
        }
        out.append({"apiVersion": API, "kind": "ClusterQueue",
                    "metadata": {"name": team, "labels": {"shardctl.dev/team": team}}, "spec": spec})
    namespaces = sorted({p.namespace or "default" for p in pools})
    for team in sorted(pf.teams):
        for ns in namespaces:
            out.append({"apiVersion": API, "kind": "LocalQueue",
                        "metadata": {"name": local_queue_name(team), "namespace": ns},
                        "spec": {"clusterQueue": team}})
    for value in priority_bands(pf):
        out.append({"apiVersion": API, "kind": "WorkloadPriorityClass", "metadata": {"name": band_name(value)},
                    "value": value, "description": f"shardctl priority band {value}"})
    return out


def _resource_groups(amounts: dict[str, int], flavors: dict[str, str], resource: dict[str, str]) -> list[Any]:
    return _group_rows([(k, {"name": resource[k], "nominalQuota": amounts[k]}) for k in sorted(amounts)], flavors)


def _group_rows(per_flavor: list[tuple[str, dict[str, Any]]], flavors: dict[str, str]) -> list[dict[str, Any]]:
    """One resource group per covered resource (GPU kinds share `nvidia.com/gpu`; `cpu` has its own)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for k, res in per_flavor:
        groups.setdefault(res["name"], []).append({"name": flavors[k], "resources": [res]})
    return [{"coveredResources": [name], "flavors": rows} for name, rows in sorted(groups.items())]


def to_yaml(objects: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(objects, sort_keys=False)


__all__ = ["flavor_name", "render_kueue", "to_yaml"]
