"""The Kubernetes backend end to end: the real `kubernetes` client against the fake API server."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.k8s.conftest import IMAGE, NS, make_request
from tests.k8s.fake_apiserver import FakeApiServer, now_iso
from workers.backends.base import Backend, BackendUnavailable, Handle, RunState
from workers.backends.k8s_objects import RenderOptions, render_objects
from workers.backends.kubernetes import KubernetesBackend, SubmissionRejected

NAME = "shardctl-7-1"


def _backend(fake: FakeApiServer, **kwargs: Any) -> KubernetesBackend:
    api = client.ApiClient(client.Configuration(host=fake.host))
    return KubernetesBackend(api, **{"namespace": NS, "default_image": IMAGE,
                                     "queue_for_team": {"vision": "vision-queue"}, **kwargs})


def test_protocol_and_capabilities(backend: KubernetesBackend) -> None:
    assert isinstance(backend, Backend)
    caps = backend.capabilities
    assert caps.multi_node and caps.gpus and caps.logs and caps.preemption_requeue


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
    assert obs.state == RunState.FAILED and obs.failure == "program" and obs.exit_code == 3
    assert obs.log_tail == "Traceback...\nValueError: boom"
    assert pods[1] in (obs.reason or "")


def test_oom_killed_is_the_program_with_137(fake: FakeApiServer, backend: KubernetesBackend) -> None:
    handle, pods = _run(fake, backend)
    fake.set_pod(NS, pods[0], phase="Failed", exit_code=137, reason="OOMKilled")
    fake.set_condition("jobsets", NS, NAME, "Failed", reason="FailurePolicyRuleAction")
    obs = backend.poll([handle])[NAME]
    assert (obs.failure, obs.exit_code) == ("program", 137) and "OOMKilled" in (obs.reason or "")


@pytest.mark.parametrize("how,failure", [
    ({"reason": "Evicted", "phase": "Failed"}, "node"),
    ({"disruption": "DeletionByTaintManager", "phase": "Failed", "exit_code": 143}, "node"),
    ({"disruption": "DeletionByPodGC", "phase": "Failed"}, "node"),
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
    objs = render_objects(make_request(), backend.options, "jobset", redact=False)
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
    objs = render_objects(make_request(), backend.options, "jobset", redact=False)
    foreign = objs[-1]
    foreign["metadata"]["labels"] = {"app.kubernetes.io/managed-by": "someone-else"}
    fake._store("jobsets", NS, foreign)
    assert backend.find(NAME) is None
    with pytest.raises(SubmissionRejected, match="not managed by shardctl"):
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
        with pytest.raises(SubmissionRejected, match="does not serve jobset"):
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
        assert (obs.failure, obs.exit_code) == ("program", 42)
        fake.set_condition("jobs", NS, NAME, "Complete")
        assert backend.poll([handle])[NAME].state == RunState.SUCCEEDED


def test_pytorchjob_lifecycle_and_logs_by_rank(fake: FakeApiServer, backend: KubernetesBackend) -> None:
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
    fake.set_log(NS, f"{NAME}-worker-0", "rank1 line1\nrank1 line2\n")
    assert list(backend.logs(handle, rank=1)) == ["rank1 line1", "rank1 line2"]
    assert list(backend.logs(handle, rank=7)) == []
    fake.set_condition("pytorchjobs", NS, NAME, "Succeeded")
    assert backend.poll([handle])[NAME].state == RunState.SUCCEEDED


def test_logs_of_a_jobset_rank_follow(fake: FakeApiServer, backend: KubernetesBackend) -> None:
    handle, pods = _run(fake, backend)
    fake.set_log(NS, pods[0], "step 1\nstep 2")
    assert list(backend.logs(handle, 0, follow=True)) == ["step 1", "step 2"]
    assert any(p.endswith(f"/pods/{pods[0]}/log") and q.get("follow") == ["true"] for m, p, q in fake.requests)


def test_namespaces_are_an_allow_list(fake: FakeApiServer) -> None:
    backend = _backend(fake, namespaces=["team-b"])
    with pytest.raises(SubmissionRejected, match="not managed"):
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


def test_rejection_by_the_server_is_submission_rejected(fake: FakeApiServer, backend: KubernetesBackend) -> None:
    req = make_request(backend={"node_selector": {"bad key!": "x"}})
    with pytest.raises(SubmissionRejected, match="422"):
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
