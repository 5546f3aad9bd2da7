"""Fixtures for the Kubernetes backend tests: the fake API server, a real client pointed at it, a
backend, and launch requests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from tests.k8s.fake_apiserver import FakeApiServer
from tests.k8s.schemas import require_crd_schemas
from workers.backends.base import LaunchRequest
from workers.backends.kubernetes import KubernetesBackend

NS = "team-a"
IMAGE = "ghcr.io/shardctl/runtime:0.1.0"


def make_request(job_id: int = 7, attempt: int = 1, *, nodes: int = 2, procs: int = 8, gpus_per_proc: int = 1,
                 team: str = "vision", backend: dict[str, Any] | None = None, image: str | None = None,
                 env: dict[str, str] | None = None, command: list[str] | None = None) -> LaunchRequest:
    plan = {"nodes": nodes, "gpus_per_node": procs, "layout": {"dp": nodes * procs, "tp": 1, "pp": 1, "cp": 1}}
    return LaunchRequest(
        job_id=job_id, attempt=attempt, name=f"shardctl-{job_id}-{attempt}", nodes=nodes, procs_per_node=procs,
        gpus_per_proc=gpus_per_proc, command=command or ["python", "-m", "workers.runtime"],
        env={"SHARDCTL_PLAN_JSON": f'{{"nodes": {nodes}}}', "SHARDCTL_JOB_ID": str(job_id),
             "SHARDCTL_ATTEMPT": str(attempt), "SHARDCTL_JOB_TOKEN": "shc_1_not-a-real-secret",
             "SHARDCTL_URL": "http://shardctl.shardctl-system:8000", **(env or {})},
        image=image, plan=plan, spec={"name": "t", "backend": {"kind": "kubernetes", **(backend or {})}}, team=team)


@pytest.fixture
def request_factory() -> Callable[..., LaunchRequest]:
    return make_request


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    """A fake cluster with the JobSet and Kubeflow APIs (needs the shared CRD schemas)."""
    require_crd_schemas()
    server = FakeApiServer().start()
    yield server
    server.go_down()


@pytest.fixture
def api_client(fake: FakeApiServer) -> Iterator[Any]:
    config = client.Configuration(host=fake.host)
    with client.ApiClient(config) as api:
        yield api


@pytest.fixture
def backend(api_client: Any) -> KubernetesBackend:
    return KubernetesBackend(api_client, namespace=NS, default_image=IMAGE, queue_for_team={"vision": "vision-queue"})
