"""Kueue-managed pools (mapping onto the schedulers teams already run): shardctl does not
gate their jobs. A dispatcher leases them at once with their pool recorded, their workloads carry the
team's LocalQueue and priority class (the names `shardctl export kueue` renders) and start suspended,
and the engine's snapshot leaves them out, so other pools' quotas are untouched. Through the API and a
real dispatcher against the fake API server (which validates every object against the schemas)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from sqlalchemy import select

from service.scheduling.config_file import PoolsFile
from service.scheduling.export_kueue import render_kueue
from service.scheduling.kueue_names import KueueQueue
from service.scheduling.snapshot import build_snapshot
from service.store.db import make_engine, make_sessionmaker
from service.store.models import Job
from service.store.pools import load_at_start
from tests.db_fixtures import Env
from tests.k8s.conftest import IMAGE, make_request
from tests.k8s.fake_apiserver import FakeApiServer
from tests.k8s.schemas import require_crd_schemas, validate
from tests.specs import tiny
from workers.backends.kubernetes import KubernetesBackend
from workers.backends.kubernetes.render import RenderOptions, render_objects
from workers.dispatch.context import DispatcherConfig
from workers.dispatcher import Dispatcher

NS = "training"
H100, A100 = "H100-SXM-80GB", "A100-SXM-80GB"
QUEUE, PRIORITY_CLASS = "kueue.x-k8s.io/queue-name", "kueue.x-k8s.io/priority-class"
#: a Kueue pool of H100s and a pool of A100s that shardctl's engine gates, on the same cluster;
#: vision owns nothing and may borrow nothing of either kind; nlp owns the A100s.
POOLS: dict[str, Any] = {
    "pools": [{"name": "h100-kueue", "backend": "kubernetes", "gpu": H100, "gpus": 8, "namespace": NS,
               "kueue": True},
              {"name": "a100", "backend": "kubernetes", "gpu": A100, "gpus": 4, "namespace": NS}],
    "teams": {"vision": {"max_priority": 50, "flavors": {H100: {"nominal": 0, "borrowing_limit": 0},
                                                         A100: {"nominal": 0, "borrowing_limit": 0}}},
              "nlp": {"flavors": {A100: {"nominal": 4}}}},
}


def _dispatcher(env: Env, fake: FakeApiServer) -> Dispatcher:
    api = client.ApiClient(client.Configuration(host=fake.host))
    backend = KubernetesBackend(api, namespace=NS, default_image=IMAGE)
    return Dispatcher(make_sessionmaker(make_engine(env.url)), {"kubernetes": backend},
                      DispatcherConfig(retry_backoff_s=0.0))


def _declare_through_the_api(env: Env, admin: dict[str, str]) -> None:
    for pool in POOLS["pools"]:
        body = {k: v for k, v in pool.items() if k != "name"}
        r = env.client.put(f"/v1/pools/{pool['name']}", json=body, headers=admin)
        assert r.status_code in (200, 201), r.text
    for team, quota in POOLS["teams"].items():
        r = env.client.put(f"/v1/teams/{team}/quota", json=quota, headers=admin)
        assert r.status_code == 200, r.text


def _declare_from_a_pools_file(env: Env) -> None:
    """What `serve` and `worker` do at start with SHARDCTL_POOLS_FILE."""
    with env.app.state.sessions.begin() as session:
        load_at_start(session, PoolsFile.model_validate(POOLS))


def _submit(env: Env, admin: dict[str, str], team: str, gpu: str, gpus: int, priority: int = 0) -> int:
    spec = tiny(name=f"{team}-{gpu.lower()}-{priority}", team=team, priority=priority,
                resources={"gpu": gpu, "nodes": 1, "gpus_per_node": gpus}, backend={"kind": "kubernetes"},
                entrypoint={"command": ["python", "train.py"], "image": "example.org/train:1"})
    r = env.client.post("/v1/jobs", json=spec, headers=admin)
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def _jobs(env: Env) -> dict[int, tuple[str, str | None]]:
    with env.app.state.sessions.begin() as session:
        return {i: (s.value, p) for i, s, p in session.execute(select(Job.id, Job.status, Job.pool))}


@pytest.mark.parametrize("declare", ["api", "pools-file"])
def test_kueue_pool_jobs_are_not_gated_and_are_labelled_and_suspended(
        env: Env, admin: dict[str, str], fake: FakeApiServer, declare: str) -> None:
    if declare == "api":
        _declare_through_the_api(env, admin)
    else:
        _declare_from_a_pools_file(env)
    # Two jobs fill the 8-GPU Kueue pool twice over, for a team with no quota of that kind: Kueue decides.
    urgent = _submit(env, admin, "vision", H100, 8, priority=50)
    routine = _submit(env, admin, "vision", H100, 8, priority=10)
    gated = _submit(env, admin, "vision", A100, 2)  # the engine's pool: vision may not borrow A100s
    owned = _submit(env, admin, "nlp", A100, 4)  # nlp's whole nominal quota, untouched by the Kueue jobs
    before = env.client.get(f"/v1/jobs/{urgent}/explain", headers=admin)  # before any dispatcher cycle
    assert before.status_code == 200 and before.json()["pool"] == "h100-kueue", before.text
    assert "Kueue" in before.json()["note"] and before.json()["admitted"] is False

    _dispatcher(env, fake).run_once()

    jobs = _jobs(env)
    assert jobs[urgent] == jobs[routine] == ("PENDING", "h100-kueue")  # leased at once, its pool recorded
    assert jobs[owned] == ("PENDING", "a100")
    assert jobs[gated] == ("QUEUED", None)  # still gated by shardctl's engine
    bands = {urgent: "shardctl-p50", routine: "shardctl-p0"}  # the bands are 0 and vision's max 50
    for job_id, band in bands.items():
        js = fake.get("jobsets", NS, f"shardctl-{job_id}-1")
        assert js is not None
        assert js["metadata"]["labels"][QUEUE] == "vision" and js["metadata"]["labels"][PRIORITY_CLASS] == band
        assert js["spec"]["suspend"] is True
        assert validate(js) == []
    nlp = fake.get("jobsets", NS, f"shardctl-{owned}-1")
    assert nlp is not None and QUEUE not in nlp["metadata"]["labels"] and "suspend" not in nlp["spec"]
    # The labels name objects `shardctl export kueue` renders for the same pools and teams.
    exported = render_kueue(PoolsFile.model_validate(POOLS))
    assert ("LocalQueue", "vision", NS) in {(o["kind"], o["metadata"]["name"], o["metadata"].get("namespace"))
                                            for o in exported}
    assert set(bands.values()) <= {o["metadata"]["name"] for o in exported if o["kind"] == "WorkloadPriorityClass"}

    # The engine's snapshot has neither the Kueue pool nor its jobs.
    with env.app.state.sessions.begin() as session:
        snap = build_snapshot(session)
    assert "h100-kueue" not in {p.name for p in snap.pools} and "a100" in {p.name for p in snap.pools}
    assert {r.id for r in snap.running} == {owned}
    assert {w.id for w in snap.waiting} == {gated}
    explained = env.client.get(f"/v1/jobs/{gated}/explain", headers=admin).json()
    assert explained["admitted"] is False and explained["reasons"], explained
    urgent_explained = env.client.get(f"/v1/jobs/{urgent}/explain", headers=admin).json()
    assert urgent_explained["admitted"] is True and urgent_explained["pool"] == "h100-kueue"


def test_a_kueue_job_submitted_later_is_leased_while_the_engine_pool_is_full(
        env: Env, admin: dict[str, str], fake: FakeApiServer) -> None:
    _declare_through_the_api(env, admin)
    first = _submit(env, admin, "nlp", A100, 4)
    waiting = _submit(env, admin, "nlp", A100, 4)  # the A100 pool is full: it waits
    dispatcher = _dispatcher(env, fake)
    dispatcher.run_once()
    late = _submit(env, admin, "vision", H100, 4)
    dispatcher.run_once()
    jobs = _jobs(env)
    assert jobs[first] == ("PENDING", "a100") and jobs[waiting] == ("QUEUED", None)
    assert jobs[late] == ("PENDING", "h100-kueue")


def test_a_job_of_a_kueue_pools_backend_but_of_no_pools_kind_is_refused_at_submit(
        env: Env, admin: dict[str, str]) -> None:
    _declare_through_the_api(env, admin)
    spec = tiny(team="vision", resources={"gpu": "L40S-48GB", "nodes": 1, "gpus_per_node": 1},
                backend={"kind": "kubernetes"}, entrypoint={"command": ["python", "train.py"]})
    assert env.client.post("/v1/jobs", json=spec, headers=admin).status_code == 422


GOLDEN = Path(__file__).parent / "golden"
GPU_OPTIONS = {"node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}
KUEUE = KueueQueue(queue="vision", priority_class="shardctl-p50")
#: the static team -> queue setting is overridden by a Kueue pool's queue
OPTIONS = RenderOptions(namespace=NS, default_image=IMAGE, queue_for_team={"vision": "vision-queue"})
CASES = {"jobset-gpu-kueue": ("jobset", 2), "indexed-job-gpu-kueue": ("indexed-job", 2),
         "pytorchjob-gpu-kueue": ("pytorchjob", 3)}


def _render(case: str) -> list[dict[str, Any]]:
    kind, nodes = CASES[case]
    req = make_request(nodes=nodes, procs=4, backend={**GPU_OPTIONS, "object": kind})
    return render_objects(req.model_copy(update={"kueue": KUEUE}), OPTIONS, kind)  # type: ignore[arg-type]


def _suspended(workload: dict[str, Any]) -> bool:
    spec = workload["spec"]
    return bool((spec["runPolicy"] if workload["kind"] == "PyTorchJob" else spec).get("suspend"))


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_kueue_render(case: str) -> None:
    require_crd_schemas()
    objects = _render(case)
    workload = objects[-1]
    assert workload["metadata"]["labels"][QUEUE] == "vision"  # not the static "vision-queue"
    assert workload["metadata"]["labels"][PRIORITY_CLASS] == "shardctl-p50"
    assert _suspended(workload)
    assert all(QUEUE not in o["metadata"]["labels"] for o in objects[:-1])  # the workload alone
    for obj in objects:
        assert validate(obj) == [], f"{obj['kind']} {obj['metadata']['name']}"
    rendered = yaml.safe_dump_all(objects, sort_keys=False, width=120)
    path = GOLDEN / f"{case}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(rendered)
    assert path.exists(), f"golden file {path.name} missing: run with UPDATE_GOLDEN=1"
    assert rendered == path.read_text(), f"{path.name} differs; if intended, regenerate with UPDATE_GOLDEN=1"


def test_without_a_kueue_pool_the_static_queue_setting_still_labels_and_nothing_is_suspended() -> None:
    workload = render_objects(make_request(backend={"object": "jobset"}), OPTIONS, "jobset")[-1]
    assert workload["metadata"]["labels"][QUEUE] == "vision-queue"
    assert PRIORITY_CLASS not in workload["metadata"]["labels"] and not _suspended(workload)
