"""Rendering: golden files for every object kind and option, and every rendered object validated
against the official schemas. Regenerate the golden files with UPDATE_GOLDEN=1."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml
from kubernetes import client

from service.backend_options import KubernetesOptions, SlurmOptions
from service.jobenv import OUT_DIR, PLAN, TOKEN
from service.planner.result import Plan
from service.redaction import REDACTED
from tests.k8s.conftest import IMAGE, make_request
from tests.k8s.fake_apiserver import FakeApiServer
from tests.k8s.schemas import require_crd_schemas, validate
from workers.backends.base import SubmissionRefused
from workers.backends.kubernetes import KubernetesBackend
from workers.backends.kubernetes.naming import MAX_NAME, OBJECT_KINDS, ObjectKind, k8s_name
from workers.backends.kubernetes.render import (
    RenderError,
    RenderOptions,
    render_objects,
    rendezvous_endpoint,
    secret_values,
    with_secrets,
)

GOLDEN = Path(__file__).parent / "golden"
GPU_OPTIONS = {"node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
               "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}
CASES: dict[str, dict[str, Any]] = {
    # name: (object kind, request keyword arguments)
    "jobset-gpu-queue": {"object": "jobset", "nodes": 2, "procs": 8, "gpus_per_proc": 1, "team": "vision",
                         "backend": GPU_OPTIONS},
    "jobset-cpu": {"object": "jobset", "nodes": 2, "procs": 2, "gpus_per_proc": 0, "team": "nlp", "backend": {}},
    "indexed-job-gpu-queue": {"object": "indexed-job", "nodes": 4, "procs": 8, "gpus_per_proc": 1, "team": "vision",
                              "backend": GPU_OPTIONS},
    "indexed-job-cpu": {"object": "indexed-job", "nodes": 1, "procs": 1, "gpus_per_proc": 0, "team": "nlp",
                        "backend": {}},
    "pytorchjob-gpu-queue": {"object": "pytorchjob", "nodes": 3, "procs": 4, "gpus_per_proc": 1, "team": "vision",
                             "backend": GPU_OPTIONS},
    "pytorchjob-cpu-single": {"object": "pytorchjob", "nodes": 1, "procs": 2, "gpus_per_proc": 0, "team": "nlp",
                              "backend": {}},
}
OPTIONS = RenderOptions(namespace="team-a", default_image=IMAGE, queue_for_team={"vision": "vision-queue"})


def _render(case: str) -> list[dict[str, Any]]:
    c = dict(CASES[case])
    kind = c.pop("object")
    backend = {**c.pop("backend"), "object": kind}
    return render_objects(make_request(backend=backend, **c), OPTIONS, kind)


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case: str) -> None:
    rendered = yaml.safe_dump_all(_render(case), sort_keys=False, width=120)
    path = GOLDEN / f"{case}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(rendered)
    assert path.exists(), f"golden file {path.name} missing: run with UPDATE_GOLDEN=1"
    assert rendered == path.read_text(), f"{path.name} differs; if intended, regenerate with UPDATE_GOLDEN=1"


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_rendered_object_validates(case: str) -> None:
    require_crd_schemas()
    for obj in _render(case):
        assert validate(obj) == [], f"{obj['kind']} {obj['metadata']['name']}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_files_validate(case: str) -> None:
    """The checked-in golden files themselves are valid objects (they are what reviewers read)."""
    require_crd_schemas()
    for obj in yaml.safe_load_all((GOLDEN / f"{case}.yaml").read_text()):
        assert validate(obj) == []


def _workload(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return objs[-1]


def _pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    if obj["kind"] == "JobSet":
        return obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]  # type: ignore[no-any-return]
    if obj["kind"] == "Job":
        return obj["spec"]["template"]["spec"]  # type: ignore[no-any-return]
    return obj["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]  # type: ignore[no-any-return]


def test_gpu_limits_shm_selector_tolerations_and_queue() -> None:
    objs = _render("jobset-gpu-queue")
    js = _workload(objs)
    spec = _pod_spec(js)
    container = spec["containers"][0]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "8"}}  # a string quantity, limits only
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in spec["volumes"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert spec["nodeSelector"] == GPU_OPTIONS["node_selector"]
    assert spec["tolerations"] == GPU_OPTIONS["tolerations"]
    assert js["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "vision-queue"
    assert js["spec"]["replicatedJobs"][0]["template"]["spec"]["completions"] == 2
    assert js["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] == 2
    assert js["spec"]["failurePolicy"]["maxRestarts"] == 3
    # Only the workload carries the queue label (Kueue admits the top-level object).
    assert all("kueue.x-k8s.io/queue-name" not in o["metadata"]["labels"] for o in objs[:-1])


def test_cpu_job_has_no_gpu_resources_and_no_queue() -> None:
    js = _workload(_render("jobset-cpu"))
    assert "resources" not in _pod_spec(js)["containers"][0]
    assert "kueue.x-k8s.io/queue-name" not in js["metadata"]["labels"]
    assert "nodeSelector" not in _pod_spec(js) and "tolerations" not in _pod_spec(js)


def test_labels_names_and_torchrun_on_every_object() -> None:
    for case in CASES:
        for obj in _render(case):
            labels = obj["metadata"]["labels"]
            assert obj["metadata"]["name"] == "shardctl-7-1"
            assert labels["app.kubernetes.io/managed-by"] == "shardctl"
            assert labels["shardctl.dev/job-id"] == "7" and labels["shardctl.dev/attempt"] == "1"
        workload = _workload(_render(case))
        command = _pod_spec(workload)["containers"][0]["command"]
        assert command[:4] == ["python", "-m", "torch.distributed.run", "--no-python"]
        assert command[-3:] == ["python", "-m", "workers.runtime"]
        kind = CASES[case]["object"]
        assert f"--rdzv-endpoint={rendezvous_endpoint(kind, 'shardctl-7-1')}" in command
        rank = "$(PET_NODE_RANK)" if kind == "pytorchjob" else "$(SHARDCTL_NODE_RANK)"
        assert f"--node-rank={rank}" in command


def test_token_lives_in_a_secret_and_render_redacts_it() -> None:
    req = make_request()
    shown = render_objects(req, OPTIONS, "jobset")
    secret = next(o for o in shown if o["kind"] == "Secret")
    assert secret["stringData"] == {TOKEN: REDACTED}
    real = with_secrets(shown, secret_values(req))
    real_secret = next(o for o in real if o["kind"] == "Secret")
    assert real_secret["stringData"][TOKEN] == "shc_1_not-a-real-secret"
    assert [o for o in real if o["kind"] != "Secret"] == [o for o in shown if o["kind"] != "Secret"]
    env = _pod_spec(_workload(real))["containers"][0]["env"]
    token = next(e for e in env if e["name"] == TOKEN)
    assert token == {"name": TOKEN, "valueFrom": {"secretKeyRef": {"name": "shardctl-7-1", "key": TOKEN}}}
    assert "shc_1_not-a-real-secret" not in yaml.safe_dump(_workload(real))
    plan = next(e for e in env if e["name"] == PLAN)
    assert plan["valueFrom"] == {"configMapKeyRef": {"name": "shardctl-7-1", "key": "plan.json"}}


def test_the_job_contract_reaches_every_container() -> None:
    """The plan whole (as the API stored it) in the ConfigMap, the token and secret-looking user
    variables in the Secret, everything else of `req.environment()` plain; the contract wins."""
    req = make_request(env={"DB_PASSWORD": "hunter2", "MODE": "a", OUT_DIR: "/elsewhere"})
    objs = render_objects(req, OPTIONS, "jobset")
    config_map = objs[0]
    assert config_map["kind"] == "ConfigMap"
    assert config_map["data"]["plan.json"] == req.plan.model_dump_json()
    assert Plan.model_validate_json(config_map["data"]["plan.json"]) == req.plan
    secret = next(o for o in objs if o["kind"] == "Secret")
    assert secret["stringData"] == {"DB_PASSWORD": REDACTED, TOKEN: REDACTED}
    assert secret_values(req) == {"DB_PASSWORD": "hunter2", TOKEN: "shc_1_not-a-real-secret"}
    env = {e["name"]: e for e in _pod_spec(_workload(objs))["containers"][0]["env"]}
    assert set(req.environment()) <= set(env)
    assert env["MODE"] == {"name": "MODE", "value": "a"}
    assert env[OUT_DIR] == {"name": OUT_DIR, "value": "/var/run/shardctl/out"}  # the backend's, not the user's
    assert "valueFrom" in env["DB_PASSWORD"] and "hunter2" not in yaml.safe_dump(objs)


def test_without_a_token_or_secrets_there_is_no_secret() -> None:
    objs = render_objects(make_request(token=None), OPTIONS, "jobset")
    assert [o["kind"] for o in objs] == ["ConfigMap", "JobSet"]
    assert with_secrets(objs, {}) == objs


def test_user_dollar_parens_are_escaped() -> None:
    req = make_request(command=["python", "train.py", "--tag=$(HOME)"], env={"MY_VAR": "a$(B)c"})
    env = _pod_spec(_workload(render_objects(req, OPTIONS, "jobset")))["containers"][0]
    assert "--tag=$$(HOME)" in env["command"]
    assert {"name": "MY_VAR", "value": "a$$(B)c"} in env["env"]


def test_image_from_request_then_entrypoint_then_default() -> None:
    assert _pod_spec(_workload(render_objects(make_request(image="mine:1"), OPTIONS, "jobset")))[
        "containers"][0]["image"] == "mine:1"
    with pytest.raises(RenderError, match="no container image"):
        render_objects(make_request(), RenderOptions(namespace="x"), "jobset")


def test_other_backends_options_are_refused() -> None:
    req = make_request().model_copy(update={"options": SlurmOptions(kind="slurm")})
    with pytest.raises(SubmissionRefused, match="slurm"):
        render_objects(req, OPTIONS, "jobset")


def test_render_errors_are_refusals_and_value_errors() -> None:
    """`submit` refuses them for good; `POST /v1/plans` turns a ValueError into a 422."""
    assert issubclass(RenderError, SubmissionRefused) and issubclass(RenderError, ValueError)


def test_object_kinds_are_the_specs_backend_object_values() -> None:
    assert set(get_args(ObjectKind)) == set(OBJECT_KINDS)
    field = KubernetesOptions.model_fields["object"].annotation
    assert {a for arg in get_args(field) for a in get_args(arg)} == set(OBJECT_KINDS)


def test_names_are_dns_labels_and_deterministic() -> None:
    assert k8s_name("shardctl-12-3") == "shardctl-12-3"
    long = k8s_name("Shardctl_" + "x" * 80)
    assert len(long) <= MAX_NAME and long == k8s_name("Shardctl_" + "x" * 80)
    assert long.replace("-", "").isalnum() and long == long.lower()


def test_render_through_backend_is_pure_and_a_list() -> None:
    """render() never contacts the cluster (the client points at a closed port)."""
    api = client.ApiClient(client.Configuration(host="http://127.0.0.1:9"))
    backend = KubernetesBackend(api, namespace="team-a", default_image=IMAGE)
    out = backend.render(make_request())
    assert out.content["kind"] == "List" and out.content["items"][-1]["kind"] == "JobSet"
    assert [o["kind"] for o in out.content["items"]] == ["ConfigMap", "Secret", "JobSet"]
    fallback = KubernetesBackend(api, namespace="team-a", default_image=IMAGE, jobset=False).render(make_request())
    assert [o["kind"] for o in fallback.content["items"]] == ["ConfigMap", "Secret", "Service", "Job"]


@pytest.mark.parametrize("kind,plural", [("jobset", "jobsets"), ("indexed-job", "jobs"), ("pytorchjob", "pytorchjobs")])
def test_rendezvous_endpoint_is_rank0_pod_dns_name(kind: ObjectKind, plural: str) -> None:
    """The endpoint every node dials is the stable DNS name the controllers give the rank-0 pod."""
    require_crd_schemas()
    with FakeApiServer() as fake:
        req = make_request(backend={"object": kind})
        objs = with_secrets(render_objects(req, OPTIONS, kind), secret_values(req))
        for obj in objs:
            fake._store({"ConfigMap": "configmaps", "Secret": "secrets", "Service": "services"}.get(
                obj["kind"], plural), "team-a", obj)
        pods = [fake.get("pods", "team-a", p) for p in fake.make_pods(plural, "team-a", "shardctl-7-1")]
        host = rendezvous_endpoint(kind, "shardctl-7-1").split(":")[0]
        if kind == "pytorchjob":
            rank0 = next(p for p in pods
                         if p and p["metadata"]["labels"]["training.kubeflow.org/replica-type"] == "master")
            assert host == rank0["metadata"]["name"]  # the operator's per-replica Service <job>-master-0
        else:
            rank0 = next(p for p in pods if p and p["metadata"]["annotations"][
                "batch.kubernetes.io/job-completion-index"] == "0")
            assert host == f"{rank0['spec']['hostname']}.{rank0['spec']['subdomain']}"
            if kind == "indexed-job":
                svc = fake.get("services", "team-a", "shardctl-7-1")
                assert svc and svc["spec"]["clusterIP"] == "None"
                assert all(svc["spec"]["selector"].items() <= p["metadata"]["labels"].items() for p in pods if p)


def test_dispatcher_preview_is_the_rendered_list() -> None:
    """`POST /v1/plans` and `shardctl submit --dry-run` show this: the dispatcher's request, rendered."""
    from service.planner.planning import plan
    from service.spec import TrainingSpec
    from tests.specs import tiny
    from workers.dispatch.request import launch_preview

    spec = TrainingSpec.model_validate(tiny(
        backend={"kind": "kubernetes", "object": "indexed-job", "namespace": "team-a",
                 "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]},
        entrypoint={"command": ["python", "train.py"], "image": "example.org/train:1", "env": {"DB_PASSWORD": "x"}}))
    result = plan(spec)
    api = client.ApiClient(client.Configuration(host="http://127.0.0.1:9"))  # never contacted
    preview = launch_preview({"kubernetes": KubernetesBackend(api, namespace="team-a")}, "http://api")(spec, result)
    assert preview is not None and preview["backend"] == "kubernetes" and preview["name"] == "shardctl-0-1"
    items = preview["content"]["items"]
    assert [o["kind"] for o in items] == ["ConfigMap", "Secret", "Service", "Job"]
    assert items[0]["data"]["plan.json"] == result.model_dump_json()
    assert items[1]["stringData"] == {"DB_PASSWORD": REDACTED, TOKEN: REDACTED}
    pod = items[-1]["spec"]["template"]["spec"]
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    assert pod["containers"][0]["image"] == "example.org/train:1"
    assert {"name": "SHARDCTL_URL", "value": "http://api"} in pod["containers"][0]["env"]
    require_crd_schemas()
    assert all(validate(obj) == [] for obj in items)
