"""Preemption on Kubernetes (the fake API server): `Dispatcher.preempt` deletes the running JobSet with
its grace period; the end (the workload gone) counts as `preempted`, the job is queued again at once and
its next attempt is submitted, without counting against max_attempts."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from service.store.db import make_engine, make_sessionmaker
from tests.db_fixtures import Env
from tests.k8s.conftest import IMAGE
from tests.k8s.fake_apiserver import FakeApiServer
from tests.specs import tiny
from workers.backends.kubernetes import KubernetesBackend
from workers.dispatch.context import DispatcherConfig
from workers.dispatcher import Dispatcher

NS = "training"


def _job(env: Env, job_id: int, admin: dict[str, str]) -> dict[str, Any]:
    return env.client.get(f"/v1/jobs/{job_id}", headers=admin).json()  # type: ignore[no-any-return]


def test_a_preempted_jobset_is_deleted_and_the_job_queued_again(env: Env, admin: dict[str, str],
                                                                  fake: FakeApiServer) -> None:
    api = client.ApiClient(client.Configuration(host=fake.host))
    backend = KubernetesBackend(api, namespace=NS, default_image=IMAGE)
    dispatcher = Dispatcher(make_sessionmaker(make_engine(env.url)), {"kubernetes": backend},
                            DispatcherConfig(retry_backoff_s=60.0, max_attempts=1, preempt_grace_s=45))
    spec = tiny(resources={"nodes": 2, "gpus_per_node": 2}, backend={"kind": "kubernetes"},
                entrypoint={"command": ["python", "train.py"], "image": "example.org/train:1"})
    job_id = int(env.client.post("/v1/jobs", json=spec, headers=admin).json()["id"])
    dispatcher.run_once()
    name = f"shardctl-{job_id}-1"
    for i, pod in enumerate(fake.make_pods("jobsets", NS, name)):
        fake.set_pod(NS, pod, phase="Running", node=f"node-{i}")
    dispatcher.run_once()
    assert _job(env, job_id, admin)["status"] == "RUNNING"

    dispatcher.preempt(job_id, by=9, reason="team b reclaims its quota")
    assert fake.get("jobsets", NS, name) is None and ("jobsets", NS, name, "Foreground") in fake.deletions
    dispatcher.run_once()  # the end is seen: back in the queue at once (no 60 s backoff)...
    assert _job(env, job_id, admin)["status"] == "QUEUED"
    dispatcher.run_once()  # ...and submitted again by the next cycle
    job = _job(env, job_id, admin)
    first = job["attempts"][0]
    assert first["failure"] == "preempted" and "preempted by job 9: team b reclaims its quota" in first["exit_reason"]
    assert len(job["attempts"]) == 2 and job["status"] == "PENDING"  # max_attempts=1: the preemption is free
    assert fake.get("jobsets", NS, f"shardctl-{job_id}-2") is not None
    events = env.client.get(f"/v1/jobs/{job_id}/events", headers=admin).json()
    preempted = [e for e in events if e["kind"] == "job.preempted"]
    # job 9 is no job of another team here (no such job): named by its id
    assert len(preempted) == 1 and preempted[0]["data"] == {"by": 9, "by_team": None,
                                                            "reason": "team b reclaims its quota",
                                                            "attempt": 1, "grace_s": 45}
