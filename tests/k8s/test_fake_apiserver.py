"""The fake API server itself: real-server answers through the real client, label selectors, discovery,
and validation of every object (the shared bad example must be refused)."""

from __future__ import annotations

import copy
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pydantic
import pytest
from kubernetes import client
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ResourceNotFoundError

from tests.k8s.fake_apiserver import FakeApiServer, parse_selector, selector_matches
from tests.k8s.schemas import EXAMPLES_DIR, load_yaml_documents, require_crd_schemas, validate


def _examples(name: str) -> list[dict[str, Any]]:
    path = EXAMPLES_DIR / name
    if not path.exists():
        require_crd_schemas()  # same shared directory: skip (or fail under CI) with the reason
    return load_yaml_documents(path)


def _post(fake: FakeApiServer, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(fake.host + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_shared_bad_example_is_rejected_with_every_cause(fake: FakeApiServer) -> None:
    bad = _examples("indexed-job-bad.yaml")[0]
    code, status = _post(fake, "/apis/batch/v1/namespaces/team-a/jobs", bad)
    assert code == 422
    assert status["kind"] == "Status" and status["reason"] == "Invalid" and status["code"] == 422
    fields = {c["field"] for c in status["details"]["causes"]}
    # All seven deliberate errors: three schema errors, four that only the server's own rules catch.
    assert {"spec.completions", "spec.template.spec.containers[0]", "spec.template.spec.containers[0].volumeMounts[0]",
            "metadata.name", "spec.completionMode",
            "spec.template.spec.restartPolicy",
            "spec.template.spec.containers[0].resources.requests[nvidia.com/gpu]"} <= fields
    assert fake.names("jobs") == []


def test_shared_bad_example_through_the_real_client(fake: FakeApiServer, api_client: Any) -> None:
    """kubernetes 37 refuses the schema errors itself before sending (pydantic models)."""
    bad = _examples("indexed-job-bad.yaml")[0]
    with pytest.raises(pydantic.ValidationError):
        client.BatchV1Api(api_client).create_namespaced_job("team-a", bad)


@pytest.mark.parametrize("mutate,field", [
    (lambda j: j["metadata"].update(name="Train_ABC"), "metadata.name"),
    (lambda j: j["spec"].update(completionMode="Indexd"), "spec.completionMode"),
    (lambda j: j["spec"]["template"]["spec"].update(restartPolicy="Always"), "spec.template.spec.restartPolicy"),
    (lambda j: j["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"].update(
        {"nvidia.com/gpu": "4"}), "spec.template.spec.containers[0].resources.requests[nvidia.com/gpu]"),
    (lambda j: j["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0].update(name="nope"),
     "spec.template.spec.containers[0].volumeMounts"),
    (lambda j: j["metadata"].setdefault("labels", {}).update({"bad key!": "x"}), "metadata.labels"),
])
def test_semantic_rules_no_schema_encodes(fake: FakeApiServer, api_client: Any, mutate: Any, field: str) -> None:
    """Errors the schemas (and the client) let through, refused with 422 as the real server does."""
    job = next(d for d in _examples("indexed-job.yaml") if d["kind"] == "Job")
    mutate(job)
    with pytest.raises(client.ApiException) as info:
        client.BatchV1Api(api_client).create_namespaced_job("team-a", job)
    assert info.value.status == 422
    body = json.loads(info.value.body)
    assert field in {c["field"] for c in body["details"]["causes"]}


def test_crd_strict_schema_catches_typos(fake: FakeApiServer, api_client: Any) -> None:
    js = _examples("jobset.yaml")[0]
    bad = copy.deepcopy(js)
    bad["spec"]["network"] = {"enableDNSHostname": True}  # missing 's'
    custom = client.CustomObjectsApi(api_client)
    with pytest.raises(client.ApiException) as info:
        custom.create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", "team-a", "jobsets", bad)
    assert info.value.status == 422 and "enableDNSHostname" in info.value.body
    ptj = _examples("pytorchjob.yaml")[0]
    ptj["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = "two"
    with pytest.raises(client.ApiException) as info:
        custom.create_namespaced_custom_object("kubeflow.org", "v1", "team-a", "pytorchjobs", ptj)
    assert info.value.status == 422
    created = custom.create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", "team-a", "jobsets", js)
    assert created["metadata"]["uid"]


def test_every_shared_example_we_use_is_valid() -> None:
    require_crd_schemas()
    for name in ("indexed-job.yaml", "jobset.yaml", "pytorchjob.yaml", "kueue.yaml"):
        for doc in _examples(name):
            assert validate(doc) == [], f"{name}: {doc['kind']}"


def test_create_get_conflict_delete_with_status_bodies(fake: FakeApiServer, api_client: Any) -> None:
    core = client.CoreV1Api(api_client)
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c1", "labels": {"a": "1"}}, "data": {"k": "v"}}
    raw = core.create_namespaced_config_map("team-a", cm, _preload_content=False)
    assert raw.status == 201
    created = json.loads(raw.data)
    meta = created["metadata"]
    assert meta["uid"] and meta["resourceVersion"] and meta["creationTimestamp"] and meta["namespace"] == "team-a"
    with pytest.raises(client.ApiException) as info:
        core.create_namespaced_config_map("team-a", cm)
    assert info.value.status == 409
    assert json.loads(info.value.body)["reason"] == "AlreadyExists"
    got = core.read_namespaced_config_map("c1", "team-a")
    assert got.metadata.uid == meta["uid"]
    core.delete_namespaced_config_map("c1", "team-a", propagation_policy="Foreground")
    assert fake.deletions[-1] == ("configmaps", "team-a", "c1", "Foreground")
    with pytest.raises(client.ApiException) as info:
        core.read_namespaced_config_map("c1", "team-a")
    assert info.value.status == 404
    assert json.loads(info.value.body)["reason"] == "NotFound"
    with pytest.raises(client.ApiException) as info:
        core.delete_namespaced_config_map("c1", "team-a")
    assert info.value.status == 404


def test_resource_version_increases(fake: FakeApiServer, api_client: Any) -> None:
    core = client.CoreV1Api(api_client)
    rvs = [int(core.create_namespaced_config_map("team-a", {"apiVersion": "v1", "kind": "ConfigMap",
                                                            "metadata": {"name": f"c{i}"}}).metadata.resource_version)
           for i in range(3)]
    assert rvs == sorted(rvs) and len(set(rvs)) == 3


@pytest.mark.parametrize("selector,expected", [
    ("team=a", {"x", "y"}), ("team==a", {"x", "y"}), ("team!=a", {"z", "w"}),
    ("team in (a,b)", {"x", "y", "z"}), ("team notin (a)", {"z", "w"}), ("tier", {"x"}), ("!tier", {"y", "z", "w"}),
    ("team in (a, b),!tier", {"y", "z"}), ("team=a,tier=gold", {"x"}), ("", {"x", "y", "z", "w"}),
])
def test_label_selectors_through_the_client(fake: FakeApiServer, api_client: Any, selector: str,
                                            expected: set[str]) -> None:
    core = client.CoreV1Api(api_client)
    for name, labels in {"x": {"team": "a", "tier": "gold"}, "y": {"team": "a"}, "z": {"team": "b"}, "w": {}}.items():
        core.create_namespaced_config_map("team-a", {"apiVersion": "v1", "kind": "ConfigMap",
                                                     "metadata": {"name": name, "labels": labels}})
    got = core.list_namespaced_config_map("team-a", label_selector=selector)
    assert {i.metadata.name for i in got.items} == expected


def test_a_list_answers_as_a_real_server_and_leaves_the_stored_objects_alone(fake: FakeApiServer) -> None:
    """Built-in kinds' list items come without kind/apiVersion, a custom resource's with them, and the
    list takes neither from the objects it stores: a later GET still has both."""
    _post(fake, "/api/v1/namespaces/team-a/configmaps", {"apiVersion": "v1", "kind": "ConfigMap",
                                                          "metadata": {"name": "c1"}})
    js = _examples("jobset.yaml")[0]
    _post(fake, "/apis/jobset.x-k8s.io/v1alpha2/namespaces/team-a/jobsets", js)

    def get(path: str) -> dict[str, Any]:
        with urllib.request.urlopen(fake.host + path) as resp:
            answer: dict[str, Any] = json.loads(resp.read())
            return answer

    configmaps = get("/api/v1/namespaces/team-a/configmaps")
    assert (configmaps["kind"], configmaps["apiVersion"]) == ("ConfigMapList", "v1")
    assert [sorted(item) for item in configmaps["items"]] == [["metadata", "status"]]
    assert configmaps["items"][0]["metadata"]["name"] == "c1"
    jobsets = get("/apis/jobset.x-k8s.io/v1alpha2/namespaces/team-a/jobsets")
    assert [(item["kind"], item["apiVersion"]) for item in jobsets["items"]] == [("JobSet", "jobset.x-k8s.io/v1alpha2")]
    stored = get("/api/v1/namespaces/team-a/configmaps/c1")
    assert (stored["kind"], stored["apiVersion"]) == ("ConfigMap", "v1")
    assert int(configmaps["metadata"]["resourceVersion"]) >= int(stored["metadata"]["resourceVersion"])


def test_selector_parser_rejects_garbage() -> None:
    with pytest.raises(ValueError):
        parse_selector("a in b")
    assert selector_matches(parse_selector("a notin (x)"), {}) is True


def test_discovery_and_missing_crds() -> None:
    with FakeApiServer(jobset=False, pytorchjob=False) as fake:
        api = client.ApiClient(client.Configuration(host=fake.host))
        groups = [g.name for g in client.ApisApi(api).get_api_versions().groups]
        assert groups == ["batch"]
        with pytest.raises(client.ApiException) as info:
            client.CustomObjectsApi(api).get_api_resources("jobset.x-k8s.io", "v1alpha2")
        assert info.value.status == 404
        with pytest.raises(client.ApiException) as info:
            client.CustomObjectsApi(api).list_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", "x", "jobsets")
        assert info.value.status == 404
        resources = client.BatchV1Api(api).get_api_resources()
        assert [r.name for r in resources.resources] == ["jobs"]


def _dynamic(fake: FakeApiServer, cache: Path) -> Any:
    api = client.ApiClient(client.Configuration(host=fake.host))
    return DynamicClient(api, cache_file=str(cache))  # type: ignore[no-untyped-call]


@pytest.mark.parametrize("api_version,kind,plural", [
    ("v1", "ConfigMap", "configmaps"), ("v1", "Secret", "secrets"), ("v1", "Service", "services"),
    ("v1", "Pod", "pods"), ("batch/v1", "Job", "jobs"), ("jobset.x-k8s.io/v1alpha2", "JobSet", "jobsets"),
    ("kubeflow.org/v1", "PyTorchJob", "pytorchjobs"),
])
def test_dynamic_client_discovers_every_served_kind(fake: FakeApiServer, tmp_path: Path, api_version: str,
                                                    kind: str, plural: str) -> None:
    dyn = _dynamic(fake, tmp_path / "cache.json")
    res = dyn.resources.get(api_version=api_version, kind=kind)
    assert (res.name, res.namespaced, res.group_version) == (plural, True, api_version)
    assert set(res.verbs) == {"create", "delete", "get", "list", "patch"}
    assert set(res.subresources) == ({"log"} if kind == "Pod" else set())
    assert dyn.version["kubernetes"]["gitVersion"].startswith("v1.33")
    # and the path it builds is one this server answers
    assert dyn.get(res, namespace="team-a", label_selector="a=b").to_dict()["items"] == []


def test_discovery_documents_are_what_a_real_server_sends(fake: FakeApiServer) -> None:
    api = client.ApiClient(client.Configuration(host=fake.host))
    core = client.CoreV1Api(api).get_api_resources()
    assert core.group_version == "v1"
    by_name = {r.name: r for r in core.resources}
    assert set(by_name) == {"configmaps", "secrets", "services", "pods", "pods/log"}
    assert (by_name["pods/log"].kind, by_name["pods/log"].verbs) == ("Pod", ["get"])
    assert by_name["configmaps"].singular_name == "configmap"
    groups = {g.name: g for g in client.ApisApi(api).get_api_versions().groups}
    assert set(groups) == {"batch", "jobset.x-k8s.io", "kubeflow.org"}
    preferred = groups["jobset.x-k8s.io"].preferred_version
    assert preferred is not None and preferred.group_version == "jobset.x-k8s.io/v1alpha2"
    assert client.VersionApi(api).get_code().git_version == "v1.33.0-shardctl-fake"


def test_a_cluster_without_jobset_says_so_in_discovery(tmp_path: Path) -> None:
    with FakeApiServer(jobset=False, pytorchjob=False) as fake:
        dyn = _dynamic(fake, tmp_path / "cache.json")
        with pytest.raises(ResourceNotFoundError):
            dyn.resources.get(api_version="jobset.x-k8s.io/v1alpha2", kind="JobSet")
        with pytest.raises(ResourceNotFoundError):
            dyn.resources.get(api_version="kubeflow.org/v1", kind="PyTorchJob")
        assert dyn.resources.get(api_version="batch/v1", kind="Job").name == "jobs"


def test_pod_logs(fake: FakeApiServer, api_client: Any) -> None:
    js = _examples("jobset.yaml")[0]
    client.CustomObjectsApi(api_client).create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", "team-a",
                                                                        "jobsets", js)
    pod = fake.make_pods("jobsets", "team-a", "train-abc")[0]
    fake.set_log("team-a", pod, "step 1\nstep 2\n")
    core = client.CoreV1Api(api_client)
    container = fake.get("pods", "team-a", pod)["spec"]["containers"][0]["name"]  # type: ignore[index]
    assert core.read_namespaced_pod_log(pod, "team-a", container=container) == "step 1\nstep 2\n"
    with pytest.raises(client.ApiException) as info:
        core.read_namespaced_pod_log(pod, "team-a", container="nope")
    assert info.value.status == 400
    with pytest.raises(client.ApiException) as info:
        core.read_namespaced_pod_log("gone", "team-a")
    assert info.value.status == 404


def test_namespace_mismatch_is_bad_request(fake: FakeApiServer) -> None:
    code, status = _post(fake, "/api/v1/namespaces/team-a/configmaps",
                         {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "other"}})
    assert code == 400 and status["reason"] == "BadRequest"


def test_server_made_pods_are_validated_as_pods(fake: FakeApiServer, api_client: Any) -> None:
    js = _examples("jobset.yaml")[0]
    client.CustomObjectsApi(api_client).create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", "team-a",
                                                                        "jobsets", js)
    pods = fake.make_pods("jobsets", "team-a", "train-abc")
    assert len(pods) == 2
    listed = client.CoreV1Api(api_client).list_namespaced_pod(
        "team-a", label_selector="jobset.sigs.k8s.io/jobset-name=train-abc")
    assert sorted(p.metadata.name for p in listed.items) == pods
    client.CustomObjectsApi(api_client).delete_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", "team-a",
                                                                        "jobsets", "train-abc")
    assert fake.names("pods") == []  # garbage-collected with their owner
