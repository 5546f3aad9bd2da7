"""Through the API and the dispatcher, with a JobSet on the fake API server: the whole path of a job
on Kubernetes (submit, run, finish; a program error; a node failure retried; a cancel)."""

from __future__ import annotations

import base64
import time
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


def _dispatcher(env: Env, fake: FakeApiServer, api_url: str | None = None) -> Dispatcher:
    api = client.ApiClient(client.Configuration(host=fake.host))
    backend = KubernetesBackend(api, namespace=NS, default_image=IMAGE, queue_for_team={"default": "main-queue"})
    return Dispatcher(make_sessionmaker(make_engine(env.url)), {"kubernetes": backend},
                      DispatcherConfig(api_url=api_url, retry_backoff_s=0.0))


def _submit(env: Env, admin: dict[str, str]) -> int:
    spec = tiny(resources={"nodes": 2, "gpus_per_node": 2}, backend={"kind": "kubernetes"},
                entrypoint={"command": ["python", "train.py"], "image": "example.org/train:1"})
    resp = env.client.post("/v1/jobs", json=spec, headers=admin)
    assert resp.status_code in (200, 201), resp.text
    return int(resp.json()["id"])


def _job(env: Env, job_id: int, admin: dict[str, str]) -> dict[str, Any]:
    return env.client.get(f"/v1/jobs/{job_id}", headers=admin).json()  # type: ignore[no-any-return]


def _events(env: Env, job_id: int, admin: dict[str, str]) -> list[dict[str, Any]]:
    return env.client.get(f"/v1/jobs/{job_id}/events", headers=admin).json()  # type: ignore[no-any-return]


def _running(fake: FakeApiServer, name: str) -> list[str]:
    pods = fake.make_pods("jobsets", NS, name)
    for i, pod in enumerate(pods):
        fake.set_pod(NS, pod, phase="Running", node=f"node-{i}")
    return pods


def test_job_runs_on_a_jobset_to_success(env: Env, admin: dict[str, str], live: str, fake: FakeApiServer) -> None:
    job_id = _submit(env, admin)
    dispatcher = _dispatcher(env, fake, api_url=live)
    dispatcher.run_once()
    name = f"shardctl-{job_id}-1"
    assert _job(env, job_id, admin)["status"] == "PENDING"
    js = fake.get("jobsets", NS, name)
    assert js is not None
    assert js["metadata"]["labels"]["shardctl.dev/job-id"] == str(job_id)
    assert js["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "main-queue"
    container = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "example.org/train:1" and container["command"][-2:] == ["python", "train.py"]
    assert js["spec"]["replicatedJobs"][0]["template"]["spec"]["completions"] == 2
    # The job token travels in a Secret, and it is a real token: the runtime could report with it.
    secret = fake.get("secrets", NS, name)
    assert secret is not None
    token = base64.b64decode(secret["data"]["SHARDCTL_JOB_TOKEN"]).decode()
    resp = env.client.post(f"/v1/jobs/{job_id}/measurements", json={"kind": "report", "data": {"rank": "0"}},
                           headers={"Authorization": f"Bearer {token}"})
    assert resp.status_code < 300, resp.text
    assert any(e["name"] == "SHARDCTL_URL" and e["value"] == live for e in container["env"])

    _running(fake, name)
    dispatcher.run_once()
    job = _job(env, job_id, admin)
    assert job["status"] == "RUNNING" and job["attempts"][0]["nodes"] == ["node-0", "node-1"]
    fake.set_condition("jobsets", NS, name, "Completed", reason="AllJobsCompleted")
    dispatcher.run_once()
    job = _job(env, job_id, admin)
    assert job["status"] == "SUCCEEDED" and job["attempts"][0]["exit_code"] == 0
    assert [e["kind"] for e in _events(env, job_id, admin)][:3] == ["job.queued", "job.submitting", "job.pending"]


def test_program_error_fails_and_node_loss_retries(env: Env, admin: dict[str, str], fake: FakeApiServer) -> None:
    doomed, flaky = _submit(env, admin), _submit(env, admin)
    dispatcher = _dispatcher(env, fake)
    dispatcher.run_once()
    pods = _running(fake, f"shardctl-{doomed}-1")
    fake.set_pod(NS, pods[0], phase="Failed", exit_code=3, termination_message="loss is nan")
    fake.set_condition("jobsets", NS, f"shardctl-{doomed}-1", "Failed", reason="FailurePolicyRuleAction")
    pods = _running(fake, f"shardctl-{flaky}-1")
    fake.set_pod(NS, pods[1], phase="Failed", reason="Evicted")
    fake.set_condition("jobsets", NS, f"shardctl-{flaky}-1", "Failed", reason="ReachedMaxRestarts")
    dispatcher.run_once()
    job = _job(env, doomed, admin)
    assert job["status"] == "FAILED" and len(job["attempts"]) == 1
    failed = _events(env, doomed, admin)[-1]["data"]
    assert failed["exit_code"] == 3 and failed["failure"] == "program_error" and failed["log_tail"] == "loss is nan"
    assert _job(env, flaky, admin)["status"] == "QUEUED"
    time.sleep(0.05)
    dispatcher.run_once()
    job = _job(env, flaky, admin)
    assert [a["backend_name"] for a in job["attempts"]] == [f"shardctl-{flaky}-1", f"shardctl-{flaky}-2"]
    assert fake.get("jobsets", NS, f"shardctl-{flaky}-2") is not None


def test_cancel_deletes_the_jobset(env: Env, admin: dict[str, str], fake: FakeApiServer) -> None:
    job_id = _submit(env, admin)
    dispatcher = _dispatcher(env, fake)
    dispatcher.run_once()
    _running(fake, f"shardctl-{job_id}-1")
    dispatcher.run_once()
    assert env.client.post(f"/v1/jobs/{job_id}/cancel", headers=admin).json()["status"] == "CANCELLING"
    for _ in range(5):
        dispatcher.run_once()
        if _job(env, job_id, admin)["status"] == "CANCELLED":
            break
    assert fake.names("jobsets") == [] and fake.names("pods") == []
    assert (("jobsets", NS, f"shardctl-{job_id}-1", "Foreground")) in fake.deletions
    assert _job(env, job_id, admin)["status"] == "CANCELLED", [e["kind"] for e in _events(env, job_id, admin)]


def test_unreachable_cluster_keeps_the_job_waiting(env: Env, admin: dict[str, str], fake: FakeApiServer) -> None:
    job_id = _submit(env, admin)
    dispatcher = _dispatcher(env, fake)
    fake.go_down()
    report = dispatcher.run_once()
    assert "kubernetes" in report.unreachable
    assert _job(env, job_id, admin)["status"] == "SUBMITTING"
    fake.come_back()
    time.sleep(0.05)
    for _ in range(3):
        dispatcher.run_once()
    assert _job(env, job_id, admin)["status"] == "PENDING"
    assert fake.names("jobsets", NS) == [f"shardctl-{job_id}-1"]
