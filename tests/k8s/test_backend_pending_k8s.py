"""`backend_pending` on Kubernetes, with the fake API server: why the cluster holds a workload (a pod's
`PodScheduled=False` condition, a suspended workload waiting for Kueue) in the backend's own words;
through the dispatcher, recorded once per change (`job.backend_pending`), and quoted by `GET
/v1/jobs/{id}/explain` and `shardctl why`."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from service.cli.scheduling_cmds import explanation_lines
from service.store.db import make_engine, make_sessionmaker
from tests.db_fixtures import Env
from tests.k8s.conftest import IMAGE, NS, make_request
from tests.k8s.fake_apiserver import FakeApiServer, now_iso
from tests.specs import tiny
from workers.backends.base import RunState
from workers.backends.kubernetes import KubernetesBackend
from workers.dispatch.context import DispatcherConfig
from workers.dispatcher import Dispatcher

NAME = "shardctl-7-1"
GPUS = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."
TRAINING = "training"


def test_an_unschedulable_pod_is_the_reason(fake: FakeApiServer, backend: KubernetesBackend) -> None:
    handle = backend.submit(make_request())
    assert backend.poll([handle])[NAME].pending_reason is None  # no pods yet: nothing said
    pods = fake.make_pods("jobsets", NS, NAME)
    fake.set_pod(NS, pods[1], unschedulable_since=now_iso(), message=GPUS)
    obs = backend.poll([handle])[NAME]
    assert obs.state == RunState.PENDING and obs.pending_reason == f"Unschedulable: {GPUS}"
    assert obs.expected_start is None and obs.failure is None


def test_a_suspended_workload_waits_for_kueue(fake: FakeApiServer, backend: KubernetesBackend) -> None:
    handle = backend.submit(make_request())
    fake.set_condition("jobsets", NS, NAME, "Suspended", reason="", message="")
    assert backend.poll([handle])[NAME].pending_reason == "suspended: waiting for Kueue admission"
    fake.set_condition("jobsets", NS, NAME, "Suspended", reason="SuspendedJobs", message="jobset is suspended")
    assert backend.poll([handle])[NAME].pending_reason == "suspended: SuspendedJobs: jobset is suspended"
    quota = "couldn't assign flavors to pod set workers: insufficient unused quota for nvidia.com/gpu in flavor h100"
    fake.set_condition("jobsets", NS, NAME, "QuotaReserved", status="False", reason="Pending", message=quota)
    obs = backend.poll([handle])[NAME]
    assert obs.state == RunState.PENDING and obs.pending_reason == f"waiting for Kueue admission: Pending: {quota}"


def _dispatcher(env: Env, fake: FakeApiServer) -> Dispatcher:
    api = client.ApiClient(client.Configuration(host=fake.host))
    return Dispatcher(make_sessionmaker(make_engine(env.url)),
                      {"kubernetes": KubernetesBackend(api, namespace=TRAINING, default_image=IMAGE)},
                      DispatcherConfig(retry_backoff_s=0.0))


def _get(env: Env, path: str, admin: dict[str, str]) -> Any:
    return env.client.get(path, headers=admin).json()


def _recorded(env: Env, job_id: int, admin: dict[str, str]) -> list[dict[str, Any]]:
    return [e for e in _get(env, f"/v1/jobs/{job_id}/events", admin) if e["kind"] == "job.backend_pending"]


def test_the_dispatcher_records_each_change_once_and_explain_quotes_it(env: Env, admin: dict[str, str],
                                                                       fake: FakeApiServer) -> None:
    r = env.client.put("/v1/pools/k8s", json={"backend": "kubernetes", "gpu": "cpu", "gpus": 8,
                                              "namespace": TRAINING}, headers=admin)
    assert r.status_code in (200, 201), r.text
    spec = tiny(resources={"nodes": 2, "gpus_per_node": 2}, backend={"kind": "kubernetes"},
                entrypoint={"command": ["python", "train.py"], "image": "example.org/train:1"})
    job_id = env.client.post("/v1/jobs", json=spec, headers=admin).json()["id"]
    dispatcher = _dispatcher(env, fake)
    dispatcher.run_once()
    assert _get(env, f"/v1/jobs/{job_id}", admin)["status"] == "PENDING"
    generic = _get(env, f"/v1/jobs/{job_id}/explain", admin)  # nothing from the cluster yet
    assert [r["code"] for r in generic["reasons"]] == ["backend_pending"] and generic["eta"] is None
    name = f"shardctl-{job_id}-1"
    pods = fake.make_pods("jobsets", TRAINING, name)
    for pod in pods:
        fake.set_pod(TRAINING, pod, unschedulable_since=now_iso(), message=GPUS)
    for _ in range(3):
        dispatcher.run_once()
    assert [e["data"] for e in _recorded(env, job_id, admin)] == [
        {"reason": f"Unschedulable: {GPUS}", "expected_start": None, "attempt": 1}]

    why = _get(env, f"/v1/jobs/{job_id}/explain", admin)
    assert why["status"] == "PENDING" and why["admitted"] is True and why["pool"] == "k8s"
    [reason] = why["reasons"]
    assert reason["code"] == "backend_pending" and reason["message"] == (
        f"admitted to pool k8s; Kubernetes holds it: Unschedulable: {GPUS}")
    eta = why["eta"]
    assert (eta["earliest_s"], eta["latest_s"], eta["backend_start_s"]) == (0.0, 0.0, None)
    assert "already admitted" in eta["method"] and "Kubernetes gives no start estimate" in eta["method"]
    lines = explanation_lines(job_id, why)
    assert f"  backend_pending: admitted to pool k8s; Kubernetes holds it: Unschedulable: {GPUS}" in lines[1]
    assert "  shardctl's band: starts now" in lines and "  the backend's estimate: none given" in lines

    # The scheduler says something else: one more event. A restarted dispatcher reads the last one back.
    fewer = "0/4 nodes are available: 2 Insufficient nvidia.com/gpu, 2 node(s) had untolerated taint."
    for pod in pods:
        fake.set_pod(TRAINING, pod, unschedulable_since=now_iso(), message=fewer)
    dispatcher.run_once()
    restarted = _dispatcher(env, fake)
    restarted.run_once()
    restarted.run_once()
    assert [e["data"]["reason"] for e in _recorded(env, job_id, admin)] == [f"Unschedulable: {GPUS}",
                                                                            f"Unschedulable: {fewer}"]
    assert _get(env, f"/v1/jobs/{job_id}/explain", admin)["reasons"][0]["message"].endswith(fewer)

    # Placed and running: explain no longer speaks of the cluster holding it.
    for i, pod in enumerate(pods):
        fake.set_pod(TRAINING, pod, phase="Running", node=f"node-{i}")
    restarted.run_once()
    running = _get(env, f"/v1/jobs/{job_id}/explain", admin)
    assert running["status"] == "RUNNING" and running["reasons"] == [] and "running" in running["note"]


def test_a_job_of_a_kueue_pool_waits_for_kueue_admission(env: Env, admin: dict[str, str],
                                                          fake: FakeApiServer) -> None:
    r = env.client.put("/v1/pools/k8s-kueue", json={"backend": "kubernetes", "gpu": "cpu", "gpus": 8,
                                                    "namespace": TRAINING, "kueue": True}, headers=admin)
    assert r.status_code in (200, 201), r.text
    spec = tiny(backend={"kind": "kubernetes"}, entrypoint={"command": ["python", "train.py"],
                                                            "image": "example.org/train:1"})
    job_id = env.client.post("/v1/jobs", json=spec, headers=admin).json()["id"]
    dispatcher = _dispatcher(env, fake)
    dispatcher.run_once()  # submitted suspended: Kueue has not admitted it (no controller runs here)
    dispatcher.run_once()
    assert fake.get("jobsets", TRAINING, f"shardctl-{job_id}-1")["spec"]["suspend"] is True  # type: ignore[index]
    assert [e["data"]["reason"] for e in _recorded(env, job_id, admin)] == ["suspended: waiting for Kueue admission"]
    why = _get(env, f"/v1/jobs/{job_id}/explain", admin)
    assert why["reasons"][0]["message"] == ("admitted to pool k8s-kueue; Kubernetes holds it: suspended: waiting"
                                            " for Kueue admission")
