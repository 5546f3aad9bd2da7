"""`shardctl export kueue`: the quota tree as Kueue objects, valid against the official CRD schemas."""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped, unused-ignore]
import pytest
import yaml
from typer.testing import CliRunner

from service.cli.main import app
from service.scheduling.config_file import parse_pools_text
from service.scheduling.export_kueue import render_kueue, to_yaml
from tests.k8s.schemas import SCHEMA_DIR, openapi_to_jsonschema, require_crd_schemas, validate

POOLS = """
pools:
  - {name: h100, backend: kubernetes, gpu: H100-SXM-80GB, gpus: 32, namespace: ml, flavor: h100-80gb,
     preemption: lower_priority}
  - {name: l40s, backend: kubernetes, gpu: L40S-48GB, gpus: 16, namespace: inference}
  - {name: slurm-a100, backend: slurm, gpu: A100-SXM-80GB, gpus: 64, partition: gpu}
teams:
  vision: {weight: 2, max_priority: 50, group: research,
           flavors: {H100-SXM-80GB: {nominal: 16, borrowing_limit: 8, lending_limit: 4}}}
  nlp: {weight: 0.5, group: research, flavors: {H100-SXM-80GB: {nominal: 8}, L40S-48GB: {nominal: 8}}}
  ops: {weight: 0, max_priority: -10, flavors: {L40S-48GB: {nominal: 4, borrowing_limit: 0}}}
"""


@cache
def _cohort_validator() -> jsonschema.Draft7Validator:
    crd = yaml.safe_load((SCHEMA_DIR / "kueue" / "kueue.x-k8s.io_cohorts.yaml").read_text())
    entry = next(v for v in crd["spec"]["versions"] if v["name"] == "v1beta2")
    schema = openapi_to_jsonschema(copy.deepcopy(entry["schema"]["openAPIV3Schema"]))
    schema.setdefault("properties", {})["metadata"] = {"type": "object"}
    return jsonschema.Draft7Validator(schema)


def _errors(obj: dict[str, Any]) -> list[Any]:
    if obj["kind"] == "Cohort":  # not in the k8s test helper's table: the same conversion of its CRD
        return [e.message for e in _cohort_validator().iter_errors(obj)]
    return validate(obj)


def objects() -> list[dict[str, Any]]:
    return render_kueue(parse_pools_text(POOLS))


def by(kind: str) -> dict[str, dict[str, Any]]:
    return {f"{o['metadata'].get('namespace', '')}/{o['metadata']['name']}".lstrip("/"): o
            for o in objects() if o["kind"] == kind}


def test_every_object_is_valid_against_the_official_schemas() -> None:
    require_crd_schemas()
    rendered = objects()
    assert {o["kind"] for o in rendered} == {"ResourceFlavor", "Cohort", "ClusterQueue", "LocalQueue",
                                              "WorkloadPriorityClass"}
    for obj in rendered:
        assert _errors(obj) == [], obj
    assert list(yaml.safe_load_all(to_yaml(rendered))) == rendered


def test_the_schema_check_catches_a_broken_object() -> None:
    require_crd_schemas()
    cq = copy.deepcopy(by("ClusterQueue")["vision"])
    cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] = "lots"
    assert _errors(cq)


def test_flavors_come_from_kubernetes_pools_only() -> None:
    assert set(by("ResourceFlavor")) == {"h100-80gb", "l40s-48gb"}


def test_cluster_queues_carry_quotas_limits_cohorts_and_weights() -> None:
    cqs = by("ClusterQueue")
    vision = cqs["vision"]["spec"]
    assert vision["cohortName"] == "research"
    assert vision["fairSharing"] == {"weight": 2}
    rows = {f["name"]: f["resources"][0] for f in vision["resourceGroups"][0]["flavors"]}
    assert rows["h100-80gb"] == {"name": "nvidia.com/gpu", "nominalQuota": 16, "borrowingLimit": 8,
                                 "lendingLimit": 4}
    assert rows["l40s-48gb"] == {"name": "nvidia.com/gpu", "nominalQuota": 0, "borrowingLimit": 0}
    assert vision["resourceGroups"][0]["coveredResources"] == ["nvidia.com/gpu"]
    assert cqs["nlp"]["spec"]["fairSharing"] == {"weight": "0.5"}
    assert cqs["ops"]["spec"]["cohortName"] == "shardctl" and cqs["ops"]["spec"]["fairSharing"] == {"weight": 0}
    assert vision["preemption"] == {"reclaimWithinCohort": "Any", "withinClusterQueue": "LowerPriority"}


def test_cohorts_nest_groups_under_a_root_that_holds_unowned_capacity() -> None:
    cohorts = by("Cohort")
    assert cohorts["research"]["spec"] == {"parentName": "shardctl"}
    root = cohorts["shardctl"]["spec"]["resourceGroups"][0]["flavors"]
    # h100: 32 - 16 - 8 = 8 unowned; l40s: 16 - 8 - 4 = 4
    assert {f["name"]: f["resources"][0]["nominalQuota"] for f in root} == {"h100-80gb": 8, "l40s-48gb": 4}


def test_local_queues_per_team_and_namespace_and_priority_bands() -> None:
    assert set(by("LocalQueue")) == {f"{ns}/{t}" for ns in ("ml", "inference") for t in ("vision", "nlp", "ops")}
    assert by("LocalQueue")["ml/vision"]["spec"] == {"clusterQueue": "vision"}
    assert {n: o["value"] for n, o in by("WorkloadPriorityClass").items()} == {
        "shardctl-m10": -10, "shardctl-p0": 0, "shardctl-p50": 50, "shardctl-p100": 100}


def test_no_kubernetes_pool_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="no pool has backend kubernetes"):
        render_kueue(parse_pools_text("pools: [{name: a, backend: slurm, gpu: cpu, gpus: 2}]"))


def test_shardctl_export_kueue_and_slurm_print_what_the_renderers_render(tmp_path: Path) -> None:
    path = tmp_path / "pools.yaml"
    path.write_text(POOLS)
    kueue = CliRunner().invoke(app, ["export", "kueue", "--pools", str(path)])
    assert kueue.exit_code == 0, kueue.output
    assert list(yaml.safe_load_all(kueue.output)) == objects()
    slurm_only = tmp_path / "slurm.yaml"
    slurm_only.write_text(POOLS.replace("backend: kubernetes", "backend: slurm"))
    slurm = CliRunner().invoke(app, ["export", "slurm", "--pools", str(slurm_only)])
    assert slurm.exit_code == 0, slurm.output
    lines = slurm.output.splitlines()
    assert all(line.startswith("sacctmgr -i add ") for line in lines)
    vision = next(line for line in lines if "add account vision " in line)
    assert "parent=research" in vision and "Fairshare=200" in vision and "GrpTRES=gres/gpu=24" in vision
    refused = CliRunner().invoke(app, ["export", "kueue", "--pools", str(slurm_only)])
    assert refused.exit_code == 1 and "no pool has backend kubernetes" in refused.output
