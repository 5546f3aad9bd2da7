"""The dispatcher as the chart configures it: the environment the rendered dispatcher Deployment sets
(its values, the Secret and ConfigMap it references, its mounts) becomes `Settings`, and
`shardctl worker`'s wiring built from them drives one job end to end through the fake API server,
with every request it makes allowed by the chart's Role.

What stands in for the cluster: the database URL from the DB Secret is the test's database; the
volume mounts are folders under tmp_path (a ConfigMap's files written there); the in-cluster
service account is a kubeconfig that points at the fake API server."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.cli import wiring
from service.settings import Settings
from tests.db_fixtures import Env
from tests.deploy.chart import render, scenario
from tests.deploy.podenv import container_environment, kubeconfig
from tests.deploy.rbac import allows, authorization, roles_by_namespace
from tests.k8s.fake_apiserver import FakeApiServer
from tests.k8s.schemas import require_crd_schemas
from tests.specs import tiny


def test_dispatcher_from_the_chart_runs_a_job(env: Env, fake_cluster: FakeApiServer, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    objs = render(scenario("postgres"))
    # The operator's existingSecret is not in the render: the test's database stands in for its URL.
    variables = container_environment(objs, "Deployment", "shardctl-dispatcher", root=tmp_path / "pod",
                                       kube=kubeconfig(tmp_path / "kubeconfig", fake_cluster.host),
                                       stand_ins={"SHARDCTL_DATABASE_URL": env.url})
    for name in [n for n in os.environ if n.startswith("SHARDCTL_")]:
        monkeypatch.delenv(name)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    assert settings.kubernetes_namespace == "training" and settings.kubernetes_namespaces == ["team-b"]
    assert settings.kubernetes_default_image == "ghcr.io/shardctl/shardctl-runtime:0.1.0"
    assert settings.pools_file is not None and settings.pools_file.is_file()

    sessions = wiring.open_store(settings)
    wiring.load_pools(settings, sessions)  # what `shardctl worker` loads at start
    backends = wiring.make_backends(settings)
    assert "kubernetes" in backends
    dispatcher = wiring.make_dispatcher(settings, sessions, backends)

    member = env.headers(env.token("member", team="vision"))
    spec = tiny(resources={"gpu": "H100-SXM-80GB", "nodes": 2, "gpus_per_node": 8}, backend={"kind": "kubernetes"},
                entrypoint={"command": ["python", "-m", "workers.runtime"]})
    resp = env.client.post("/v1/jobs", json=spec, headers=member)
    assert resp.status_code in (200, 201), resp.text
    job_id = int(resp.json()["id"])
    name = f"shardctl-{job_id}-1"

    def status() -> str:
        return str(env.client.get(f"/v1/jobs/{job_id}", headers=member).json()["status"])

    dispatcher.run_once()
    assert status() == "PENDING"
    jobset = fake_cluster.get("jobsets", "training", name)
    assert jobset is not None
    container = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "ghcr.io/shardctl/shardctl-runtime:0.1.0"  # values.image.runtime
    job_env = {e["name"]: e.get("value") for e in container["env"]}
    assert job_env["SHARDCTL_URL"] == "http://shardctl.shardctl-system.svc:8686"  # the chart's public URL
    assert jobset["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "vision-queue"
    secret = fake_cluster.get("secrets", "training", name)
    assert secret is not None and base64.b64decode(secret["data"]["SHARDCTL_JOB_TOKEN"])

    for i, pod in enumerate(fake_cluster.make_pods("jobsets", "training", name)):
        fake_cluster.set_pod("training", pod, phase="Running", node=f"node-{i}")
    dispatcher.run_once()
    assert status() == "RUNNING"
    fake_cluster.set_condition("jobsets", "training", name, "Completed", reason="AllJobsCompleted")
    dispatcher.run_once()
    assert status() == "SUCCEEDED"

    roles = roles_by_namespace(objs)
    checked = [a for a in (authorization(m, p, q) for m, p, q in fake_cluster.requests) if a is not None]
    assert checked and [a for a in checked if a.namespace not in roles or not allows(roles[a.namespace], a)] == []


@pytest.fixture
def fake_cluster() -> Iterator[FakeApiServer]:
    require_crd_schemas()
    server = FakeApiServer().start()
    yield server
    server.go_down()
