"""The Helm chart (helm/shardctl), rendered by the real Helm engine: every scenario lints strictly and
renders objects that validate; the defaults match their golden file; the values schema and the
template refuse what cannot work; the operational contracts (probes, rollout checksum, hooks,
security, secrets kept out of ConfigMaps) hold in every scenario."""

from __future__ import annotations

import base64
import json
import os
import re
from typing import Any

import helm_python as helm
import pytest
import yaml

from service.scheduling.config_file import parse_pools_text
from tests.deploy.chart import (
    CHART,
    GOLDEN,
    K8S_VERSIONS,
    MASKED,
    env_of,
    find,
    lint,
    one,
    pod_spec,
    render,
    render_raw,
    scenario,
    scenario_names,
    validation_errors,
)

#: (release name, namespace) per scenario; "renamed" is the release that is not called shardctl.
RELEASES = {"renamed": ("ml-platform", "research")}
WORKLOAD_KINDS = {"Deployment", "Job", "Pod"}


def _release(name: str) -> tuple[str, str]:
    return RELEASES.get(name, ("shardctl", "shardctl-system"))


def _render(name: str, **overrides: Any) -> list[dict[str, Any]]:
    release, ns = _release(name)
    return render({**scenario(name), **overrides}, name=release, namespace=ns)


def _containers(objs: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(o, c) for o in objs if o["kind"] in WORKLOAD_KINDS for c in pod_spec(o)["containers"]]


def test_the_scenarios_are_the_ones_documented() -> None:
    assert scenario_names() == ["defaults", "exposed", "oauth2", "postgres", "renamed"]


@pytest.mark.parametrize("name", scenario_names())
def test_lint_strict_passes(name: str) -> None:
    assert lint(scenario(name), namespace=_release(name)[1]) == []


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name", scenario_names())
def test_every_rendered_object_validates(name: str, version: str) -> None:
    objs = _render(name)
    assert objs
    assert [e for o in objs for e in validation_errors(o, version)] == []
    release, ns = _release(name)
    for o in objs:
        if o["kind"] not in {"ClusterRole"} and o["metadata"].get("namespace") not in (ns, "team-a", "team-b",
                                                                                           "training"):
            raise AssertionError(f"{o['kind']} {o['metadata']['name']} in namespace {o['metadata'].get('namespace')}")
        assert o["metadata"]["labels"]["app.kubernetes.io/instance"] == release


def test_the_validator_refuses_a_broken_object() -> None:
    deployment = one(render(), "Deployment")
    pod_spec(deployment)["containers"][0]["resourcez"] = {}
    assert validation_errors(deployment)
    monitor = one(_render("exposed"), "ServiceMonitor", "shardctl-api")
    monitor["spec"]["endpoints"][0]["intervalz"] = "1s"
    assert validation_errors(monitor)


def _masked(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for o in objs:
        if o["kind"] == "Secret" and o["metadata"]["name"].endswith("-admin"):
            o["data"] = {k: MASKED for k in o["data"]}
    return objs


def test_defaults_match_the_golden_file() -> None:
    """Regenerate after an intended change: SHARDCTL_UPDATE_GOLDEN=1 .venv/bin/pytest tests/deploy/test_chart.py"""
    rendered = yaml.safe_dump_all(_masked(render()), sort_keys=True)
    golden = GOLDEN / "defaults.yaml"
    if os.environ.get("SHARDCTL_UPDATE_GOLDEN"):
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(rendered)
    assert rendered == golden.read_text(), "the chart's defaults changed; regenerate the golden file if intended"


# -- values that cannot work are refused ---------------------------------------------------------

@pytest.mark.parametrize(("values", "field"), [
    ({"api": {"replicas": "two"}}, "replicas"),
    ({"api": {"replicaz": 2}}, "replicaz"),
    ({"unknownTopLevel": True}, "unknownTopLevel"),
    ({"database": {"url": "mysql://u@h/db"}}, "url"),
    ({"settings": {"DATABASE_URL": "postgresql://x"}}, "DATABASE_URL"),
    ({"settings": {"MAX_ATTEMPTS": 5}}, "MAX_ATTEMPTS"),
    ({"settings": {"CONNECTION_CAP_EXEMPT": '["10.0.0.0/8"]'}}, "CONNECTION_CAP_EXEMPT"),
    ({"api": {"connectionCapExempt": "10.0.0.0/8"}}, "connectionCapExempt"),
    ({"kubernetes": {"namespaces": ["Team_B"]}}, "Team_B"),
    ({"oauth2Proxy": {"image": "quay.io/oauth2-proxy/oauth2-proxy:latest"}}, "image"),
    ({"ingress": {"enabled": "yes"}}, "enabled"),
])
def test_the_schema_refuses_bad_values(values: dict[str, Any], field: str) -> None:
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(chart.merge_values({}))  # the defaults pass
        with pytest.raises(helm.HelmValuesError, match=field):
            chart.validate_schema(chart.merge_values(values))
    assert any(field in finding for finding in lint(values)), lint(values)


@pytest.mark.parametrize("values", [{"api": {"replicas": 2}}, {"dispatcher": {"replicas": 2}},
                                    {"autoscaling": {"enabled": True}}])
def test_sqlite_is_refused_for_more_than_one_replica(values: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmRenderError, match=r"SQLite .* cannot serve .* set database\.url"):
        render(values)
    # The same with PostgreSQL renders.
    render({**values, "database": {"url": "postgresql://u:p@db/shardctl"}})


def test_oauth2_proxy_needs_its_secret() -> None:
    with pytest.raises(helm.HelmRenderError, match=r"oauth2Proxy\.existingSecret"):
        render({"oauth2Proxy": {"enabled": True}})


# -- operational contracts -----------------------------------------------------------------------

@pytest.mark.parametrize("name", scenario_names())
def test_security_defaults_in_every_container(name: str) -> None:
    for obj, container in _containers(_render(name)):
        where = f"{obj['kind']} {obj['metadata']['name']} / {container['name']}"
        sc = container["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True, where
        assert sc["capabilities"] == {"drop": ["ALL"]} and sc["runAsNonRoot"] is True, where
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, where
        pod = pod_spec(obj)["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] != 0, where
        mounts = {m["mountPath"] for m in container.get("volumeMounts", [])}
        if container["name"] != "oauth2-proxy":
            assert "/tmp" in mounts, where
        if container["name"] in ("api", "dispatcher", "migrate"):
            assert "/var/lib/shardctl" in mounts, where
        assert ":latest" not in container["image"] and ":" in container["image"], where


def test_api_probes_and_the_config_checksum_rolls_pods() -> None:
    objs = _render("postgres")
    api = one(objs, "Deployment", "shardctl")
    container = pod_spec(api)["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["command"][:2] == ["shardctl", "serve"] and "--workers" in container["command"]
    assert "--with-dispatcher" not in container["command"]
    assert api["spec"]["replicas"] == 3
    dispatcher = one(objs, "Deployment", "shardctl-dispatcher")
    assert dispatcher["spec"]["replicas"] == 2
    assert pod_spec(dispatcher)["containers"][0]["command"] == ["shardctl", "worker"]

    def checksums(values: dict[str, Any]) -> list[str]:
        rendered = render({**scenario("postgres"), **values})
        return [d["spec"]["template"]["metadata"]["annotations"]["checksum/config"] for d in find(rendered,
                                                                                                 "Deployment")]

    same = checksums({})
    assert same == checksums({}) and len(set(same)) == 1
    assert checksums({"settings": {"LOG_LEVEL": "DEBUG"}}) != same
    assert checksums({"teams": {"vision": {"weight": 3, "flavors": {"H100-SXM-80GB": {"nominal": 8}}}}}) != same
    assert checksums({"image": {"runtime": "example.org/runtime:2"}}) != same


def test_sqlite_default_runs_one_pod_with_the_dispatcher_inside() -> None:
    objs = render()
    api = one(objs, "Deployment")
    container = pod_spec(api)["containers"][0]
    assert api["spec"]["replicas"] == 1 and container["command"][-3:] == ["--workers", "1", "--with-dispatcher"]
    assert "SHARDCTL_DATABASE_URL" not in env_of(container)  # SQLite under SHARDCTL_DATA_DIR (an emptyDir)
    assert pod_spec(api)["automountServiceAccountToken"] is True
    assert find(objs, "Job") == []  # serve migrates its own file


def test_migration_hook_job() -> None:
    for name in ("postgres", "exposed"):
        job = one(_render(name), "Job")
        ann = job["metadata"]["annotations"]
        assert ann["helm.sh/hook"] == "pre-install,pre-upgrade"
        assert ann["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
        assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] == 600
        spec = pod_spec(job)
        assert spec["containers"][0]["command"] == ["shardctl", "db", "upgrade"]
        # It runs before the release's ServiceAccount exists: it must not name it.
        assert "serviceAccountName" not in spec and spec["automountServiceAccountToken"] is False
        url = env_of(spec["containers"][0])["SHARDCTL_DATABASE_URL"]["secretKeyRef"]
        if name == "postgres":
            assert url == {"name": "shardctl-postgres", "key": "DATABASE_URL"}
        else:
            # The chart's own DB Secret is a hook too, created before the Job that reads it.
            secret = one(_render(name), "Secret", url["name"])
            assert int(secret["metadata"]["annotations"]["helm.sh/hook-weight"]) < int(ann["helm.sh/hook-weight"])
            assert secret["stringData"][url["key"]].startswith("postgresql://")


def test_secrets_never_land_in_configmaps_or_pod_specs() -> None:
    objs = _render("exposed")
    text = yaml.safe_dump_all([o for o in objs if o["kind"] != "Secret"])
    assert "not-a-real-password" not in text
    admin = one(objs, "Secret", "shardctl-admin")
    token = base64.b64decode(admin["data"]["token"]).decode()
    assert re.fullmatch(r"shc_[A-Za-z0-9]{16}_[A-Za-z0-9]{48}", token) and token not in text
    assert admin["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    api = pod_spec(one(objs, "Deployment", "shardctl"))["containers"][0]
    assert env_of(api)["SHARDCTL_BOOTSTRAP_ADMIN_TOKEN"] == {"secretKeyRef": {"name": "shardctl-admin",
                                                                                "key": "token"}}
    # NOTES.txt tells how to read it, and does not print it.
    notes = render_raw(scenario("exposed"))["shardctl/templates/NOTES.txt"]
    assert "kubectl -n shardctl-system get secret shardctl-admin" in notes and token not in notes
    assert "https://shardctl.example.org" in notes


def test_admin_token_from_an_existing_secret() -> None:
    objs = render({"bootstrapAdmin": {"existingSecret": "my-admin", "existingSecretKey": "secret"}})
    assert find(objs, "Secret") == []
    api = pod_spec(one(objs, "Deployment"))["containers"][0]
    assert env_of(api)["SHARDCTL_BOOTSTRAP_ADMIN_TOKEN"] == {"secretKeyRef": {"name": "my-admin", "key": "secret"}}


def test_pools_and_quotas_file_is_what_the_server_parses() -> None:
    objs = _render("postgres")
    config = one(objs, "ConfigMap")
    declared = parse_pools_text(config["data"]["pools.yaml"], source="configmap")
    assert [p.name for p in declared.pools] == ["h100"] and declared.teams["vision"].weight == 2
    for deployment in find(objs, "Deployment"):
        container = pod_spec(deployment)["containers"][0]
        path = env_of(container)["SHARDCTL_POOLS_FILE"]
        mount = next(m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/"))
        volume = next(v for v in pod_spec(deployment)["volumes"] if v["name"] == mount["name"])
        assert volume["configMap"]["name"] == config["metadata"]["name"]
        assert path.rsplit("/", 1)[1] in config["data"]


def test_settings_reach_both_deployments() -> None:
    for deployment in find(_render("postgres"), "Deployment"):
        env = env_of(pod_spec(deployment)["containers"][0])
        assert env["SHARDCTL_MAX_ATTEMPTS"] == "5"
        assert env["SHARDCTL_KUBERNETES_DEFAULT_IMAGE"] == "ghcr.io/shardctl/shardctl-runtime:0.1.0"
        assert env["SHARDCTL_KUBERNETES_NAMESPACE"] == "training"
        assert json.loads(env["SHARDCTL_KUBERNETES_NAMESPACES"]) == ["team-b"]
        assert json.loads(env["SHARDCTL_KUBERNETES_QUEUES"]) == {"vision": "vision-queue"}
        assert json.loads(env["SHARDCTL_BACKENDS"]) == ["kubernetes"]
        assert env["SHARDCTL_PUBLIC_URL"] == "http://shardctl.shardctl-system.svc:8686"


def test_another_release_name_and_namespace() -> None:
    objs = _render("renamed")
    names = {(o["kind"], o["metadata"]["name"]) for o in objs}
    assert ("Deployment", "ml-platform-trainctl") in names
    assert ("Deployment", "ml-platform-trainctl-dispatcher") in names
    assert ("ServiceAccount", "trainer-dispatch") in names
    roles = {o["metadata"]["namespace"] for o in find(objs, "Role")}
    assert roles == {"research", "team-a", "team-b"}
    for binding in find(objs, "RoleBinding"):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "trainer-dispatch",
                                        "namespace": "research"}]
    env = env_of(pod_spec(one(objs, "Deployment", "ml-platform-trainctl-dispatcher"))["containers"][0])
    assert env["SHARDCTL_PUBLIC_URL"] == "http://ml-platform-trainctl.research.svc:8686"
    assert env["SHARDCTL_KUBERNETES_NAMESPACE"] == "research"
    # Two releases in one namespace collide only on what the values name outright (the ServiceAccount).
    other = {(o["kind"], o["metadata"]["name"]) for o in render(scenario("renamed"), name="second",
                                                                namespace="research")}
    assert names & other == {("ServiceAccount", "trainer-dispatch")}
    # A long release name still gives valid names (validated above for every object).
    long = render(scenario("postgres"), name="a" * 53, namespace="x")
    assert [e for o in long for e in validation_errors(o)] == []
    assert all(len(o["metadata"]["name"]) <= 63 for o in long if o["kind"] != "ClusterRole")


def test_exposed_ingress_hpa_servicemonitor_clusterrole() -> None:
    objs = _render("exposed")
    ingress = one(objs, "Ingress")
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": "shardctl", "port": {"name": "http"}}
    hpa = one(objs, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "shardctl" and hpa["spec"]["minReplicas"] == 2
    assert "replicas" not in one(objs, "Deployment", "shardctl")["spec"]  # the HPA owns it
    monitors = {m["metadata"]["name"]: m for m in find(objs, "ServiceMonitor")}
    assert monitors["shardctl-api"]["spec"]["endpoints"][0]["port"] == "http"
    assert monitors["shardctl-dispatcher"]["spec"]["endpoints"][0]["port"] == "metrics"
    assert monitors["shardctl-api"]["metadata"]["labels"]["release"] == "prometheus"
    services = {s["metadata"]["name"]: s for s in find(objs, "Service")}
    for m in monitors.values():
        selected = [s for s in services.values()
                    if m["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()]
        assert selected[0]["spec"]["ports"][0]["name"] == m["spec"]["endpoints"][0]["port"]
    role = one(objs, "ClusterRole")
    assert find(objs, "Role") == []
    assert one(objs, "RoleBinding")["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                                   "name": role["metadata"]["name"]}


def test_oauth2_proxy_sidecar_and_forwarded_trust_only_then() -> None:
    objs = _render("oauth2")
    api = pod_spec(one(objs, "Deployment", "shardctl"))
    names = [c["name"] for c in api["containers"]]
    assert names == ["api", "oauth2-proxy"]
    proxy = api["containers"][1]
    assert "--upstream=http://127.0.0.1:8686/" in proxy["args"]
    assert "--cookie-samesite=lax" in proxy["args"]  # its sign-in cookie stays off other sites' forms
    assert all(v["secretKeyRef"]["name"] == "shardctl-oauth2" for v in env_of(proxy).values())
    env = env_of(api["containers"][0])
    assert env["SHARDCTL_FORWARDED_AUTH"] == "true"
    assert env["SHARDCTL_FORWARDED_TRUSTED_PROXIES"] == '["127.0.0.1/32"]'
    assert json.loads(env["SHARDCTL_FORWARDED_TEAM_GROUPS"]) == {"ml-vision": "vision"}
    assert json.loads(env["SHARDCTL_FORWARDED_ADMIN_GROUPS"]) == ["platform-admins"]
    # The sidecar carries every browser's connections: not held to one client's connection cap.
    assert env["SHARDCTL_CONNECTION_CAP_EXEMPT"] == '["127.0.0.1/32"]'
    ingress = one(objs, "Ingress")
    assert ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]["port"] == {"name": "proxy"}
    # Without the proxy, nothing trusts forwarded headers.
    for name in ("defaults", "postgres", "exposed", "renamed"):
        for _, container in _containers(_render(name)):
            assert not [k for k in env_of(container) if k.startswith("SHARDCTL_FORWARDED")], name


def test_the_connection_cap_exempts_the_given_addresses_and_the_sidecar_on_the_api_only() -> None:
    for name in ("defaults", "postgres", "exposed", "renamed"):
        for _, container in _containers(_render(name)):
            assert "SHARDCTL_CONNECTION_CAP_EXEMPT" not in env_of(container), name
    given = {"api": {"connectionCapExempt": ["10.42.0.0/16"]}}
    for values, expected in ((given, ["10.42.0.0/16"]),
                             ({**scenario("oauth2"), **given}, ["10.42.0.0/16", "127.0.0.1/32"])):
        objs = render(values)
        env = env_of(pod_spec(one(objs, "Deployment", "shardctl"))["containers"][0])
        assert json.loads(env["SHARDCTL_CONNECTION_CAP_EXEMPT"]) == expected
        dispatchers = [d for d in find(objs, "Deployment") if d["metadata"]["name"] != "shardctl"]
        assert all("SHARDCTL_CONNECTION_CAP_EXEMPT" not in env_of(c) for d in dispatchers
                   for c in pod_spec(d)["containers"])


def test_network_policy_admits_only_the_served_ports() -> None:
    objs = _render("postgres")
    policies = {p["metadata"]["name"]: p for p in find(objs, "NetworkPolicy")}
    api = policies["shardctl"]["spec"]
    assert api["policyTypes"] == ["Ingress"]
    assert [p["port"] for p in api["ingress"][0]["ports"]] == ["http"]
    assert [p["port"] for p in policies["shardctl-dispatcher"]["spec"]["ingress"][0]["ports"]] == ["metrics"]
    narrowed = render({**scenario("postgres"), "networkPolicy": {"apiFrom": [{"namespaceSelector": {
        "matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}]}})
    peers = one(narrowed, "NetworkPolicy", "shardctl")["spec"]["ingress"][0]["from"]
    assert len(peers) == 2  # the given peer, and this release's own pods (the helm test)


def test_pdb_and_helm_test_pod() -> None:
    objs = _render("postgres")
    assert sorted(p["metadata"]["name"] for p in find(objs, "PodDisruptionBudget")) == ["shardctl-api",
                                                                                         "shardctl-dispatcher"]
    test_pod = one(objs, "Pod")
    assert test_pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    script = test_pod["spec"]["containers"][0]["command"][-1]
    assert "/healthz" in script and "/v1/plans" in script
    assert env_of(test_pod["spec"]["containers"][0])["API"] == "http://shardctl.shardctl-system.svc:8686"
