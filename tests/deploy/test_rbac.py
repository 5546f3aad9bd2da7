"""The chart's RBAC is exactly what the Kubernetes backend needs: every request the backend makes
through a job's whole life (submit of each workload kind, poll, find, logs, cancel, preempt), in the
default namespace and in another allowed one, is allowed by the Role the chart renders there; and the
Role grants nothing the backend never asks for (no wildcards)."""

from __future__ import annotations

import pytest
from kubernetes import client

from tests.deploy.chart import render, scenario
from tests.deploy.rbac import Access, allows, authorization, grants, roles_by_namespace
from tests.k8s.conftest import IMAGE, make_request
from tests.k8s.fake_apiserver import FakeApiServer
from workers.backends.base import Handle
from workers.backends.kubernetes import KubernetesBackend

HOME, OTHER = "training", "team-b"  # the postgres scenario's kubernetes.namespace and namespaces


def _whole_lives(fake: FakeApiServer) -> None:
    """Every backend operation, on every workload kind, in both namespaces."""
    api = client.ApiClient(client.Configuration(host=fake.host))
    backend = KubernetesBackend(api, namespace=HOME, namespaces=(OTHER,), default_image=IMAGE,
                                queue_for_team={"vision": "vision-queue"})
    handles: list[Handle] = []
    plural = {"jobset": "jobsets", "indexed-job": "jobs", "pytorchjob": "pytorchjobs"}
    for i, (kind, ns) in enumerate([("jobset", HOME), ("indexed-job", HOME), ("pytorchjob", HOME),
                                    ("jobset", OTHER), ("indexed-job", OTHER)]):
        req = make_request(job_id=10 + i, nodes=2, procs=1, gpus_per_proc=0, env={"HF_TOKEN": "hf_x"},
                           backend={"object": kind, **({"namespace": ns} if ns != HOME else {})})
        handle = backend.submit(req)
        handles.append(handle)
        for pod in fake.make_pods(plural[kind], ns, req.name):
            fake.set_pod(ns, pod, phase="Running", node="node-0")
            fake.set_log(ns, pod, "step 1\n")
    backend.poll(handles)
    for h in handles:
        assert backend.find(h.name) is not None
        backend.read_logs(h, rank=None, cursor=None, limit=100)
    for job_id, kind in ((10, "jobset"), (11, "indexed-job")):  # a resubmission adopts what is there
        backend.submit(make_request(job_id=job_id, nodes=2, procs=1, gpus_per_proc=0, env={"HF_TOKEN": "hf_x"},
                                    backend={"object": kind}))
    backend.preempt(handles[0], 30.0)
    for h in handles[1:]:
        backend.cancel(h)
    backend.poll(handles)


@pytest.mark.parametrize("cluster_role", [False, True])
def test_the_role_allows_every_request_the_backend_makes_and_nothing_more(fake: FakeApiServer,
                                                                          cluster_role: bool) -> None:
    objs = render({**scenario("postgres"), "rbac": {"create": True, "clusterRole": cluster_role}})
    roles = roles_by_namespace(objs)
    assert set(roles) == {HOME, OTHER}
    _whole_lives(fake)
    accesses = [authorization(m, p, q) for m, p, q in fake.requests]
    checked = [a for a in accesses if a is not None]
    assert len(checked) > 20
    denied = [a for a in checked if a.namespace not in roles or not allows(roles[a.namespace], a)]
    assert denied == [], f"the chart's Role does not allow: {sorted(set(denied), key=str)}"
    used = {(a.group, a.resource, a.verb) for a in checked}
    for ns, rules in roles.items():
        assert not [r for r in rules for k in ("apiGroups", "resources", "verbs") if "*" in r.get(k, [])]
        unused = grants(rules) - used
        assert unused == set(), f"{ns}: the Role grants what the backend never uses: {sorted(unused)}"


def test_the_check_itself_refuses_what_the_role_does_not_grant() -> None:
    rules = roles_by_namespace(render(scenario("postgres")))[HOME]
    assert allows(rules, Access("list", "", "pods", HOME))
    assert not allows(rules, Access("update", "", "secrets", HOME))
    assert not allows(rules, Access("create", "", "pods", HOME))
    assert not allows(rules, Access("get", "kueue.x-k8s.io", "workloads", HOME))
    assert authorization("GET", "/api/v1/namespaces/x/pods/p/log", {}) == Access("get", "", "pods/log", "x")
    assert authorization("GET", "/apis/batch/v1/jobs", {}) == Access("list", "batch", "jobs", None)
    assert authorization("GET", "/apis/jobset.x-k8s.io/v1alpha2", {}) is None
    with pytest.raises(ValueError):
        authorization("GET", "/healthz", {})
