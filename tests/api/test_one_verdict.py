"""Plan, dry run and submit answer alike: for every example and for generated specs, `POST /v1/plans`,
`shardctl submit --dry-run`, `shardctl plan --server`, the dashboard's Plan page and `POST /v1/jobs`
give the same layout and the same verdict, with the same error code."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.cli.render import EXIT_DOES_NOT_FIT, EXIT_ERROR, EXIT_OK
from tests.conftest import EXAMPLES
from tests.db_fixtures import Env

Outcome = tuple[int, str | None]  # (201, None) when the job is queued; else the refusal's status and code


def _submitted(env: Env, headers: dict[str, str], spec: dict[str, Any]) -> tuple[Outcome, str | None]:
    r = env.client.post("/v1/jobs", json=spec, headers=headers)
    if r.status_code == 201:
        return (201, None), r.json()["layout"]
    return (r.status_code, r.json()["error"]["code"]), None


def _previewed(env: Env, headers: dict[str, str], spec: dict[str, Any]) -> tuple[Outcome, str | None]:
    r = env.client.post("/v1/plans", json=spec, headers=headers)
    if r.status_code != 200:
        return (r.status_code, r.json()["error"]["code"]), None
    body = r.json()
    verdict = body["verdict"]
    short = _short(body["layout"])
    if verdict["submittable"]:
        return (201, None), short
    return (verdict["status"], verdict["code"]), None


def _short(layout: dict[str, Any]) -> str:
    from service.planner.layout import Layout

    return Layout(**layout).short()


def _exit_of(outcome: Outcome) -> int:
    if outcome[0] == 201:
        return EXIT_OK
    return EXIT_DOES_NOT_FIT if outcome[1] == "does_not_fit" else EXIT_ERROR


def _page(env: Env, csrf: str, spec: dict[str, Any]) -> tuple[int, str]:
    r = env.client.post("/ui/plan", data={"csrf": csrf, "spec": yaml.safe_dump(spec)})
    return r.status_code, r.text


def check_agreement(env: Env, cli: Callable[..., tuple[int, str]], csrf: str, headers: dict[str, str],
                    spec: dict[str, Any], folder: Path) -> None:
    path = folder / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    previewed, planned_layout = _previewed(env, headers, spec)
    dry_code, dry_out = cli("submit", str(path), "--dry-run")
    plan_code, plan_out = cli("plan", str(path), "--server", "--brief")
    status, page = _page(env, csrf, spec)
    submitted, queued_layout = _submitted(env, headers, spec)  # last: it queues the job

    assert previewed == submitted, (spec, previewed, submitted)
    assert dry_code == _exit_of(submitted), (spec, submitted, dry_out)
    assert plan_code == _exit_of(submitted), (spec, submitted, plan_out)
    if submitted[0] == 201:
        assert planned_layout == queued_layout
        assert status == 200 and "Submit this job" in page and planned_layout is not None
        assert planned_layout in plan_out
    elif planned_layout is None and previewed[1] in ("does_not_fit", "needs_runtime_support", "invalid_spec",
                                                     "not_found", "priority_over_limit") and status == 200:
        assert "Submit this job" not in page and f"({submitted[1]})" in page, (spec, submitted)
    else:  # refused before there is a plan: the page answers with the same status
        assert status == submitted[0], (spec, submitted, status)


@pytest.fixture
def agreement(env: Env, admin_cli: Callable[..., tuple[int, str]], tmp_path: Path
              ) -> tuple[Env, Callable[..., tuple[int, str]], str, dict[str, str]]:
    token = env.token("admin")
    csrf = env.sign_in_ui(token)
    return env, admin_cli, csrf, env.headers(token)


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_example_gets_one_verdict_from_every_entry_point(
        agreement: tuple[Env, Callable[..., tuple[int, str]], str, dict[str, str]], example: Path,
        tmp_path: Path) -> None:
    env, cli, csrf, headers = agreement
    check_agreement(env, cli, csrf, headers, yaml.safe_load(example.read_text()), tmp_path)


SPECS = st.fixed_dictionaries({
    "model": st.sampled_from([{"preset": "llama-tiny"}, {"preset": "llama-2-7b"}, {"preset": "llama-3.1-8b"},
                              {"preset": "llama-3.1-70b"}]),
    "training": st.fixed_dictionaries({"global_batch": st.sampled_from([8, 16, 64]),
                                       "precision": st.sampled_from(["fp32", "bf16", "fp16"])}),
    "resources": st.fixed_dictionaries({"gpu": st.sampled_from(["cpu", "H100-SXM-80GB", "A100-SXM-40GB"]),
                                        "gpus_per_node": st.sampled_from([1, 2, 8]), "nodes": st.sampled_from([1, 2])}),
    "layout": st.sampled_from([{}, {"offload": "params", "sharding": "fsdp"}, {"offload": "optimizer",
                                                                                "sharding": "zero2"}]),
    "backend": st.sampled_from([{"kind": "local"}, {"kind": "slurm"}]),
    "entrypoint": st.sampled_from([None, {"command": ["python", "train.py"]}]),
    "priority": st.sampled_from([0, 5, 500]),
})


@settings(max_examples=200, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=SPECS, n=st.integers(0, 10**6))
def test_generated_specs_get_one_verdict_from_every_entry_point(
        agreement: tuple[Env, Callable[..., tuple[int, str]], str, dict[str, str]], tmp_path: Path,
        body: dict[str, Any], n: int) -> None:
    env, cli, csrf, headers = agreement
    spec = {k: v for k, v in body.items() if v is not None}
    spec["name"] = f"gen-{n}"
    if spec["resources"]["gpu"] == "cpu" and spec["training"]["precision"] != "fp32":
        spec["training"] = {**spec["training"], "precision": "fp32"}
    if json.dumps(spec).count("offload") and spec["resources"]["gpu"] == "cpu":
        spec["layout"] = {}
    check_agreement(env, cli, csrf, headers, spec, tmp_path)
