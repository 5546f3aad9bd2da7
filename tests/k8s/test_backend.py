"""The Kubernetes backend end to end: the real `kubernetes` client against the fake API server."""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from service.jobenv import TOKEN
from tests.k8s.conftest import IMAGE, NS, make_request
from tests.k8s.fake_apiserver import FakeApiServer, now_iso
from workers.backends.base import (
    Backend,
    BackendUnavailable,
    Handle,
    RunState,
    SubmissionRefused,
    TransientBackendError,
)
from workers.backends.kubernetes import KubernetesBackend
from workers.backends.kubernetes.client import KubeClient
from workers.backends.kubernetes.naming import POD, SELECTOR, WORKLOADS
from workers.backends.kubernetes.render import RenderOptions, render_objects, secret_values, with_secrets
from workers.backends.kubernetes.status import PodFields, WorkloadFields

NAME = "shardctl-7-1"


def _backend(fake: FakeApiServer, **kwargs: Any) -> KubernetesBackend:
    api = client.ApiClient(client.Configuration(host=fake.host))
    return KubernetesBackend(api, **{"namespace": NS, "default_image": IMAGE,
                                     "queue_for_team": {"vision": "vision-queue"}, **kwargs})


def test_protocol(backend: KubernetesBackend) -> None:
    assert isinstance(backend, Backend)
    assert not hasattr(backend, "capabilities") and not hasattr(backend, "logs")  # not in the protocol


def _submitted(obj: dict[str, Any]) -> dict[str, Any]:
    """A stored object as it was sent: without what the server adds (uid, status, Job defaults...)."""
    out = {k: v for k, v in obj.items() if k != "status"}
    out["metadata"] = {k: v for k, v in obj["metadata"].items()
                       if k not in ("uid", "resourceVersion", "creationTimestamp", "generation", "ownerReferences")}
    if obj["kind"] == "Secret":
        out.pop("data")
        out["stringData"] = {k: base64.b64decode(v).decode() for k, v in obj["data"].items()}
    if obj["kind"] == "Job":
        out["spec"] = {k: v for k, v in obj["spec"].items() if k != "selector"}
        labels = out["spec"]["template"]["metadata"]["labels"]
        for key in ("batch.kubernetes.io/controller-uid", "controller-uid", "batch.kubernetes.io/job-name",
                    "job-name"):
            labels.pop(key)
    return out


PLURALS = {"ConfigMap": "configmaps", "Secret": "secrets", "Service": "services", "Job": "jobs",
           "JobSet": "jobsets", "PyTorchJob": "pytorchjobs"}


@pytest.mark.parametrize("jobset,obj", [(True, None), (False, None), (True, "pytorchjob")])
def test_submit_creates_exactly_what_render_shows(jobset: bool, obj: str | None) -> None:
    """The dry run is the submission: every rendered object arrives as rendered, secrets filled in."""
    from tests.k8s.schemas import require_crd_schemas

    require_crd_schemas()
    with FakeApiServer(jobset=jobset) as fake:
        backend = _backend(fake)
        req = make_request(env={"DB_PASSWORD": "hunter2"}, backend={"object": obj} if obj else {})
        backend.submit(req)
        shown = backend.render(req).content["items"]
        stored = [fake.get(PLURALS[o["kind"]], NS, o["metadata"]["name"]) for o in shown]
        assert all(o is not None for o in stored)
        assert [_submitted(o) for o in stored if o] == with_secrets(shown, secret_values(req))
        assert next(o for o in shown if o["kind"] == "Secret")["stringData"] == {"DB_PASSWORD": "<redacted>",
                                                                                  TOKEN: "<redacted>"}


def test_jobset_lifecycle_pending_running_succeeded(fake: FakeApiServer, backend: KubernetesBackend) -> None:
    req = make_request()
    handle = backend.submit(req)
    assert handle == Handle(name=NAME, backend_id=f"jobset/{NS}/{NAME}")
    js = fake.get("jobsets", NS, NAME)
    assert js is not None
    # What arrived is exactly what render() describes (secrets aside): the client did not mangle it.
    expected = render_objects(req, RenderOptions(namespace=NS, default_image=IMAGE,
                                                 queue_for_team={"vision": "vision-queue"}), "jobset")[-1]
    assert js["spec"] == expected["spec"]
    assert js["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "vision-queue"
    for plural in ("configmaps", "secrets"):
        helper = fake.get(plural, NS, NAME)
        assert helper is not None
        assert helper["metadata"]["ownerReferences"][0]["uid"] == js["metadata"]["uid"]
    secret = fake.get("secrets", NS, NAME)
    assert secret is not None and "SHARDCTL_JOB_TOKEN" in secret["data"]

    assert backend.poll([handle])[NAME].state == RunState.PENDING
    pods = fake.make_pods("jobsets", NS, NAME)
    assert backend.poll([handle])[NAME].state == RunState.PENDING
    for i, pod in enumerate(pods):
        fake.set_pod(NS, pod, phase="Running", node=f"gpu-node-{i}")
    obs = backend.poll([handle])[NAME]
    assert obs.state == RunState.RUNNING and obs.nodes == ["gpu-node-0", "gpu-node-1"]
    for pod in pods:
        fake.set_pod(NS, pod, phase="Succeeded", exit_code=0)
    fake.set_condition("jobsets", NS, NAME, "Completed", reason="AllJobsCompleted")
    obs = backend.poll([handle])[NAME]
    assert obs.state == RunState.SUCCEEDED and obs.exit_code == 0 and obs.nodes == ["gpu-node-0", "gpu-node-1"]


def _run(fake: FakeApiServer, backend: KubernetesBackend, req: Any = None) -> tuple[Handle, list[str]]:
    handle = backend.submit(req or make_request())
    pods = fake.make_pods("jobsets", NS, NAME)
    for i, pod in enumerate(pods):
        fake.set_pod(NS, pod, phase="Running", node=f"gpu-node-{i}")
    return handle, pods


def test_program_failure_reports_exit_code_and_log_tail(fake: FakeApiServer, backend: KubernetesBackend) -> None:
    handle, pods = _run(fake, backend)
    fake.set_pod(NS, pods[1], phase="Failed", exit_code=3, termination_message="Traceback...\nValueError: boom")
    fake.set_condition("jobsets", NS, NAME, "Failed", reason="FailurePolicyRuleAction",
                       message="program-error: job shardctl-7-1-node-0 failed with reason PodFailurePolicy")
    obs = backend.poll([handle])[NAME]
    assert obs.state == RunState.FAILED and obs.failure == "program_error" and obs.exit_code == 3
    assert obs.log_tail == "Traceback...\nValueError: boom"
    assert pods[1] in (obs.reason or "")


def test_oom_killed_is_host_memory_with_137(fake: FakeApiServer, backend: KubernetesBackend) -> None:
    handle, pods = _run(fake, backend)
    fake.set_pod(NS, pods[0], phase="Failed", exit_code=137, reason="OOMKilled")
    fake.set_condition("jobsets", NS, NAME, "Failed", reason="FailurePolicyRuleAction")
    obs = backend.poll([handle])[NAME]
    assert (obs.failure, obs.exit_code) == ("oom_host", 137) and "OOMKilled" in (obs.reason or "")


@pytest.mark.parametrize("how,failure", [
    ({"reason": "Evicted", "phase": "Failed"}, "node_failure"),
    ({"disruption": "DeletionByTaintManager", "phase": "Failed", "exit_code": 143}, "node_failure"),
    ({"disruption": "DeletionByPodGC", "phase": "Failed"}, "node_failure"),
    ({"disruption": "PreemptionByScheduler", "phase": "Failed", "exit_code": 143}, "preempted"),
])
def test_infrastructure_failures_beat_the_ranks_they_took_down(fake: FakeApiServer, backend: KubernetesBackend,
                                                                how: dict[str, Any], failure: str) -> None:
    handle, pods = _run(fake, backend)
    fake.set_pod(NS, pods[0], **how)
    fake.set_pod(NS, pods[1], phase="Failed", exit_code=1)  # the survivor dies in NCCL afterwards
    fake.set_condition("jobsets", NS, NAME, "Failed", reason="ReachedMaxRestarts")
    obs = backend.poll([handle])[NAME]
    assert obs.state == RunState.FAILED and obs.failure == failure and obs.exit_code is None


def test_gang_restart_keeps_running_and_ignores_the_old_pods(fake: FakeApiServer, backend: KubernetesBackend) -> None:
    handle, pods = _run(fake, backend)
    fake.set_pod(NS, pods[0], phase="Failed", disruption="DeletionByTaintManager")
    fake.set_status("jobsets", NS, NAME, restarts=1)
    new = fake.make_pods("jobsets", NS, NAME, restart_attempt=1)
    fake.set_pod(NS, new[0], phase="Running", node="gpu-node-9")
    obs = backend.poll([handle])[NAME]
    assert obs.state == RunState.RUNNING and obs.nodes == ["gpu-node-9"] and "restarted 1" in (obs.reason or "")


def test_kueue_suspended_is_pending(fake: FakeApiServer, backend: KubernetesBackend) -> None:
    handle = backend.submit(make_request())
    fake.set_condition("jobsets", NS, NAME, "Suspended", reason="SuspendedJobs", message="jobset is suspended")
    obs = backend.poll([handle])[NAME]
    assert obs.state == RunState.PENDING and obs.failure is None and "suspended" in (obs.reason or "")


def test_unschedulable_for_long_is_capacity(fake: FakeApiServer) -> None:
    clock = [time.time()]
    backend = _backend(fake, unschedulable_after_s=300, clock=lambda: clock[0])
    handle = backend.submit(make_request())
    pods = fake.make_pods("jobsets", NS, NAME)
    fake.set_pod(NS, pods[0], unschedulable_since=now_iso())
    assert backend.poll([handle])[NAME].failure is None
    clock[0] += 301
    obs = backend.poll([handle])[NAME]
    assert obs.state == RunState.PENDING and obs.failure == "capacity" and "Insufficient nvidia.com/gpu" in (
        obs.reason or "")


def test_already_exists_means_adopt(fake: FakeApiServer, backend: KubernetesBackend) -> None:
    first = backend.submit(make_request())
    uid = fake.get("jobsets", NS, NAME)["metadata"]["uid"]  # type: ignore[index]
    fake.reset_requests()
    second = backend.submit(make_request())
    assert second == first
    assert fake.get("jobsets", NS, NAME)["metadata"]["uid"] == uid  # type: ignore[index]
    assert fake.count("POST", "/jobsets$") == 1  # tried once, got 409, adopted
    assert fake.names("jobsets") == [NAME]


def test_crash_after_helpers_before_workload_completes_on_retry(fake: FakeApiServer,
                                                                backend: KubernetesBackend) -> None:
    """A submit that died after the ConfigMap: the next submit adopts it and creates the rest."""
    objs = render_objects(make_request(), backend.options, "jobset")
    fake._store("configmaps", NS, objs[0])
    handle = backend.submit(make_request())
    assert handle.backend_id == f"jobset/{NS}/{NAME}"
    assert fake.names("secrets") == [NAME] and fake.names("jobsets") == [NAME]


def test_find_after_a_crash_with_a_fresh_backend(fake: FakeApiServer, backend: KubernetesBackend) -> None:
    handle = backend.submit(make_request())
    fresh = _backend(fake)
    assert fresh.find(NAME) == handle
    assert fresh.find("shardctl-999-1") is None


def test_name_taken_by_someone_else_is_not_adopted(fake: FakeApiServer, backend: KubernetesBackend) -> None:
    objs = with_secrets(render_objects(make_request(), backend.options, "jobset"), secret_values(make_request()))
    foreign = objs[-1]
    foreign["metadata"]["labels"] = {"app.kubernetes.io/managed-by": "someone-else"}
    fake._store("jobsets", NS, foreign)
    assert backend.find(NAME) is None
    with pytest.raises(SubmissionRefused, match="not managed by shardctl"):
        backend.submit(make_request())


def test_cancel_deletes_foreground_and_is_idempotent(fake: FakeApiServer, backend: KubernetesBackend) -> None:
    handle, _ = _run(fake, backend)
    backend.cancel(handle)
    assert fake.names("jobsets") == [] and fake.names("pods") == []
    assert fake.names("configmaps") == [] and fake.names("secrets") == []
    assert ("jobsets", NS, NAME, "Foreground") in fake.deletions
    backend.cancel(handle)  # 404s: fine
    assert backend.poll([handle])[NAME].state == RunState.CANCELLED  # this process deleted it
    assert _backend(fake).poll([handle])[NAME].state == RunState.MISSING  # a fresh process cannot know


def test_cancel_in_progress_reads_cancelled() -> None:
    from tests.k8s.schemas import require_crd_schemas

    require_crd_schemas()
    with FakeApiServer(hold_foreground=True) as fake:
        backend = _backend(fake)
        handle, _ = _run(fake, backend)
        backend.cancel(handle)
        obs = backend.poll([handle])[NAME]
        assert obs.state == RunState.CANCELLED and obs.failure == "cancelled"
        fake.finish_deletions()
        assert _backend(fake).poll([handle])[NAME].state == RunState.MISSING


@pytest.mark.parametrize("jobs", [1, 25])
def test_poll_is_one_list_per_kind_per_cycle(fake: FakeApiServer, backend: KubernetesBackend, jobs: int) -> None:
    handles = [backend.submit(make_request(job_id=100 + i)) for i in range(jobs)]
    handles.append(backend.submit(make_request(job_id=99, backend={"object": "pytorchjob"})))
    fake.reset_requests()
    observed = backend.poll(handles)
    assert len(observed) == jobs + 1
    assert all(o.state == RunState.PENDING for o in observed.values())
    assert fake.count("GET", "/jobsets$") == 1
    assert fake.count("GET", "/pytorchjobs$") == 1
    assert fake.count("GET", "/pods$") == 1
    assert len(fake.requests) == 3  # nothing else: no per-job GET
    assert all(q.get("labelSelector") == ["app.kubernetes.io/managed-by=shardctl"] for _, _, q in fake.requests)



def _only(obj: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """`obj` with only `fields` (name -> None for the whole value, or the fields of a nested object)."""
    return {k: v if fields[k] is None or not isinstance(v, dict) else _only(v, fields[k])
            for k, v in obj.items() if k in fields}


POD_READ = {"metadata": {"name": None, "labels": None, "deletionTimestamp": None}, "spec": {"nodeName": None},
            "status": None}
WORKLOAD_READ = {"metadata": {"name": None, "labels": None, "deletionTimestamp": None}, "spec": {"suspend": None},
                 "status": None}


def test_poll_lists_hold_exactly_the_fields_observe_reads_as_sent(fake: FakeApiServer,
                                                                  backend: KubernetesBackend) -> None:
    handle = backend.submit(make_request())
    pods = fake.make_pods("jobsets", NS, NAME)
    fake.set_pod(NS, pods[0], phase="Running", node="gpu-node-1")
    fake.set_pod(NS, pods[1], phase="Failed", exit_code=3, termination_message="Traceback: boom")
    fake.set_condition("jobsets", NS, NAME, "Failed", reason="FailedJobs", message="a job failed")
    kube = KubeClient(client.ApiClient(client.Configuration(host=fake.host)), 10.0)
    for api, shape, read in ((POD, PodFields, POD_READ), (WORKLOADS["jobset"], WorkloadFields, WORKLOAD_READ)):
        whole = kube.list(api, NS, SELECTOR)
        shaped = kube.list(api, NS, SELECTOR, shape=shape)
        assert whole and shaped == [_only(o, read) for o in whole]
        assert all("template" not in o["spec"] and "containers" not in o["spec"] for o in shaped if "spec" in o)
    obs = backend.poll([handle])[NAME]
    assert (obs.state, obs.exit_code, obs.nodes) == (RunState.FAILED, 3, ["gpu-node-1"])


def test_a_list_answer_not_of_the_shape_is_decoded_whole(fake: FakeApiServer, backend: KubernetesBackend) -> None:
    backend.submit(make_request())
    pods = fake.make_pods("jobsets", NS, NAME)
    fake._update("pods", NS, pods[0], lambda pod: pod.__setitem__("spec", "not an object"))
    kube = KubeClient(client.ApiClient(client.Configuration(host=fake.host)), 10.0)
    assert kube.list(POD, NS, SELECTOR, shape=PodFields) == kube.list(POD, NS, SELECTOR)

def test_fallback_to_indexed_job_without_jobset_api() -> None:
    with FakeApiServer(jobset=False, pytorchjob=False) as fake:
        backend = _backend(fake)
        handle = backend.submit(make_request())
        assert handle.backend_id == f"indexed-job/{NS}/{NAME}"
        assert fake.names("services") == [NAME] and fake.names("jobs") == [NAME]
        svc = fake.get("services", NS, NAME)
        job = fake.get("jobs", NS, NAME)
        assert svc and job and svc["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
        assert backend.render(make_request()).content["items"][-1]["kind"] == "Job"  # discovery now known
        pods = fake.make_pods("jobs", NS, NAME)
        for pod in pods:
            fake.set_pod(NS, pod, phase="Running", node="n1")
        assert backend.poll([handle])[NAME].state == RunState.RUNNING
        fake.set_condition("jobs", NS, NAME, "Failed", reason="DeadlineExceeded", message="Job was active longer")
        obs = backend.poll([handle])[NAME]
        assert (obs.state, obs.failure) == (RunState.FAILED, "timeout")
        assert _backend(fake).find(NAME) == handle
        with pytest.raises(SubmissionRefused, match="does not serve jobset"):
            backend.submit(make_request(job_id=8, backend={"object": "jobset"}))
        backend.cancel(handle)
        assert fake.names("jobs") == [] and fake.names("services") == [] and fake.names("pods") == []
        assert ("jobs", NS, NAME, "Foreground") in fake.deletions


def test_indexed_job_program_failure_from_failure_message_alone() -> None:
    """Pods already gone: the Job's PodFailurePolicy message still carries the exit code."""
    with FakeApiServer(jobset=False, pytorchjob=False) as fake:
        backend = _backend(fake)
        handle = backend.submit(make_request())
        fake.set_condition("jobs", NS, NAME, "Failed", reason="PodFailurePolicy",
                           message="Container trainer for pod team-a/shardctl-7-1-0-abcde failed with exit code 42 "
                                   "matching FailJob rule at index 1")
        obs = backend.poll([handle])[NAME]
        assert (obs.failure, obs.exit_code) == ("program_error", 42)
        fake.set_condition("jobs", NS, NAME, "Complete")
        assert backend.poll([handle])[NAME].state == RunState.SUCCEEDED


def test_pytorchjob_lifecycle(fake: FakeApiServer, backend: KubernetesBackend) -> None:
    handle = backend.submit(make_request(nodes=3, backend={"object": "pytorchjob"}))
    assert handle.backend_id == f"pytorchjob/{NS}/{NAME}"
    pods = fake.make_pods("pytorchjobs", NS, NAME)
    assert pods == [f"{NAME}-master-0", f"{NAME}-worker-0", f"{NAME}-worker-1"]
    fake.set_condition("pytorchjobs", NS, NAME, "Created")
    assert backend.poll([handle])[NAME].state == RunState.PENDING
    fake.set_condition("pytorchjobs", NS, NAME, "Running")
    for pod in pods:
        fake.set_pod(NS, pod, phase="Running", node=f"n-{pod[-1]}")
    assert backend.poll([handle])[NAME].state == RunState.RUNNING
    fake.set_condition("pytorchjobs", NS, NAME, "Succeeded")
    assert backend.poll([handle])[NAME].state == RunState.SUCCEEDED


def test_namespaces_are_an_allow_list(fake: FakeApiServer) -> None:
    backend = _backend(fake, namespaces=["team-b"])
    with pytest.raises(SubmissionRefused, match="not managed"):
        backend.submit(make_request(backend={"namespace": "kube-system"}))
    handle = backend.submit(make_request(backend={"namespace": "team-b"}))
    assert handle.backend_id == f"jobset/team-b/{NAME}"
    assert _backend(fake, namespaces=["team-b"]).find(NAME) == handle


def test_unreachable_server_is_backend_unavailable(fake: FakeApiServer, backend: KubernetesBackend) -> None:
    handle = backend.submit(make_request())
    fake.go_down()
    with pytest.raises(BackendUnavailable):
        backend.poll([handle])
    with pytest.raises(BackendUnavailable):
        backend.submit(make_request(job_id=8))
    with pytest.raises(BackendUnavailable):
        backend.cancel(handle)
    with pytest.raises(BackendUnavailable):
        _backend(fake).find(NAME)  # discovery itself
    fake.come_back()
    assert backend.poll([handle])[NAME].state == RunState.PENDING


def test_server_errors_are_backend_unavailable_not_verdicts(fake: FakeApiServer, backend: KubernetesBackend) -> None:
    handle = backend.submit(make_request())
    fake.fail_status = 503
    with pytest.raises(BackendUnavailable):
        backend.poll([handle])
    fake.fail_status = None
    assert backend.poll([handle])[NAME].state == RunState.PENDING


@pytest.mark.parametrize("status,error", [(429, TransientBackendError), (500, TransientBackendError),
                                          (502, BackendUnavailable), (504, BackendUnavailable),
                                          (401, BackendUnavailable), (403, SubmissionRefused)])
def test_answers_map_to_the_backend_error_vocabulary(fake: FakeApiServer, backend: KubernetesBackend,
                                                     status: int, error: type[Exception]) -> None:
    backend.submit(make_request(job_id=1))  # discovery done: the scripted answer hits the create itself
    fake.fail_status = status
    with pytest.raises(error) as info:
        backend.submit(make_request())
    assert type(info.value) is error and str(status) in str(info.value)


def test_a_refused_discovery_is_about_the_backend_not_the_job(fake: FakeApiServer,
                                                             backend: KubernetesBackend) -> None:
    fake.fail_paths["/apis"] = 403
    with pytest.raises(BackendUnavailable, match=r"discovery refused: .*403"):
        backend.submit(make_request())
    del fake.fail_paths["/apis"]
    assert backend.submit(make_request()).backend_id == f"jobset/{NS}/{NAME}"


def test_a_name_taken_while_submitting_is_adopted_or_retried(fake: FakeApiServer, backend: KubernetesBackend,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """409 AlreadyExists, and the object is gone by the time we read it: try again later."""
    fake._store("configmaps", NS, render_objects(make_request(), backend.options, "jobset")[0])
    monkeypatch.setattr(backend._kube, "get", lambda *args: None)
    with pytest.raises(TransientBackendError, match="existed and vanished"):
        backend.submit(make_request())


def test_an_outage_of_the_jobset_group_is_not_a_cluster_without_jobset(fake: FakeApiServer,
                                                                       backend: KubernetesBackend) -> None:
    """DynamicClient takes a 503 on a group version for "no resources": the backend asks again."""
    fake.fail_paths["/apis/jobset.x-k8s.io/v1alpha2"] = 503
    with pytest.raises(BackendUnavailable, match="503"):
        backend.submit(make_request())
    assert fake.names("configmaps") == []
    del fake.fail_paths["/apis/jobset.x-k8s.io/v1alpha2"]
    assert backend.submit(make_request()).backend_id == f"jobset/{NS}/{NAME}"


def test_discovery_is_dynamic_client_once_and_in_memory(fake: FakeApiServer, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where DynamicClient would write its cache
    backend = _backend(fake)
    assert backend.find(NAME) is None
    paths = {p for m, p, _ in fake.requests}
    assert {"/version", "/apis", "/apis/jobset.x-k8s.io/v1alpha2", "/apis/kubeflow.org/v1"} <= paths
    assert list(tmp_path.iterdir()) == []  # no discovery cache file: a CRD installed later is seen
    fake.reset_requests()
    handle = backend.submit(make_request())
    backend.poll([handle])
    backend.find(NAME)
    discovery = [p for m, p, _ in fake.requests if "/namespaces/" not in p]
    assert discovery == ["/api/v1"]  # the core group, once, on first use of a ConfigMap; nothing else again


def test_rejection_by_the_server_is_submission_refused(fake: FakeApiServer, backend: KubernetesBackend) -> None:
    req = make_request(backend={"node_selector": {"bad key!": "x"}})
    with pytest.raises(SubmissionRefused, match="422"):
        backend.submit(req)
    assert fake.names("jobsets") == []
    assert fake.names("configmaps") == [] and fake.names("secrets") == []  # helpers removed again


def test_from_environment_with_a_kubeconfig(fake: FakeApiServer, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": fake.host}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    backend = KubernetesBackend.from_environment(kubeconfig, namespace=NS, default_image=IMAGE)
    handle = backend.submit(make_request())
    assert backend.poll([handle])[NAME].state == RunState.PENDING
    with pytest.raises(BackendUnavailable, match="no Kubernetes configuration"):
        KubernetesBackend.from_environment(tmp_path / "missing")
