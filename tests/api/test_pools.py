"""Pools through the API, and the checks a submission passes against them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from service.api.app import create_app
from service.scheduling.detect import catalog_kind
from service.settings import Settings
from tests.db_fixtures import Env
from tests.specs import tiny


def cpu_pool(env: Env, admin: dict[str, str], gpus: int = 2, name: str = "local") -> None:
    r = env.client.put(f"/v1/pools/{name}", json={"backend": "local", "gpu": "cpu", "gpus": gpus}, headers=admin)
    assert r.status_code in (200, 201), r.text


def submit(env: Env, headers: dict[str, str], spec: dict[str, Any]) -> Any:
    return env.client.post("/v1/jobs", json=spec, headers=headers)


def test_the_embedded_default_is_this_machines_local_pool(env: Env, admin: dict[str, str]) -> None:
    pools = env.client.get("/v1/pools", headers=admin).json()
    local = [p for p in pools if p["backend"] == "local"]
    assert local and all(p["source"] == "detected" for p in local)
    assert any(p["name"] == "local" for p in local)
    # the bundled demo (two cpu processes) fits whatever this machine has
    assert submit(env, admin, tiny()).status_code == 201


def test_an_admin_declares_replaces_and_removes_a_pool(env: Env, admin: dict[str, str]) -> None:
    body = {"backend": "local", "gpu": "cpu", "gpus": 2}
    assert env.client.put("/v1/pools/cpu-box", json=body, headers=admin).status_code == 201
    assert env.client.put("/v1/pools/cpu-box", json={**body, "gpus": 1}, headers=admin).status_code == 200
    got = env.client.get("/v1/pools/cpu-box", headers=admin).json()
    assert got["gpus"] == 1 and got["source"] == "api" and got["in_use"] == 0
    names = {p["name"]: p["source"] for p in env.client.get("/v1/pools", headers=admin).json()}
    assert names == {"cpu-box": "api"}  # a declared local pool retires the detected one
    member = env.headers(env.token("member", team="alpha"))
    assert env.client.put("/v1/pools/other", json=body, headers=member).status_code == 403
    assert env.client.get("/v1/pools/cpu-box", headers=member).status_code == 200
    r = env.client.put("/v1/pools/cpu-box", json={**body, "name": "elsewhere"}, headers=admin)
    assert r.status_code == 422 and r.json()["error"]["fields"][0]["loc"] == "name"
    r = env.client.put("/v1/pools/cpu-box", json={**body, "gpus": 0}, headers=admin)
    assert r.status_code == 422 and r.json()["error"]["fields"][0]["loc"] == "gpus"
    assert env.client.delete("/v1/pools/cpu-box", headers=admin).status_code == 204
    assert env.client.delete("/v1/pools/cpu-box", headers=admin).status_code == 404
    assert env.client.get("/v1/pools/cpu-box", headers=admin).status_code == 404


def test_a_gpu_kind_no_pool_has_is_refused_naming_the_pools(env: Env, admin: dict[str, str]) -> None:
    cpu_pool(env, admin)
    r = submit(env, admin, tiny(resources={"gpu": "H100-SXM-80GB", "gpus_per_node": 2}))
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_spec"
    assert error["fields"][0]["loc"] == "resources.gpu"
    assert "H100-SXM-80GB" in error["message"] and "local (cpu x 2)" in error["message"]
    assert env.client.get("/v1/jobs", headers=admin).json()["items"] == []  # nothing queued to run on CPU


def test_more_gpus_than_the_largest_pool_is_refused_with_its_size(env: Env, admin: dict[str, str]) -> None:
    cpu_pool(env, admin, gpus=2)
    r = submit(env, admin, tiny(resources={"gpus_per_node": 2, "nodes": 2}))
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert "needs 4 cpu GPUs" in error["message"] and "local has 2" in error["message"]
    assert error["details"]["pool_gpus"] == 2
    assert submit(env, admin, tiny(resources={"gpus_per_node": 2, "nodes": 1})).status_code == 201


def test_a_backend_without_pools_is_left_to_its_own_scheduler(env: Env, admin: dict[str, str]) -> None:
    cpu_pool(env, admin)
    r = submit(env, admin, tiny(backend={"kind": "slurm"}, resources={"gpu": "H100-SXM-80GB", "gpus_per_node": 2}))
    assert r.status_code == 201, r.text
    explained = env.client.get(f"/v1/jobs/{r.json()['id']}/explain", headers=admin).json()
    assert explained["admitted"] is True and "no pool declared" in explained["note"]


def test_priority_above_the_teams_limit_is_a_403_naming_it(env: Env, admin: dict[str, str]) -> None:
    cpu_pool(env, admin)
    member = env.headers(env.token("member", team="alpha"))
    r = env.client.put("/v1/teams/alpha/quota", json={"max_priority": 10, "flavors": {"cpu": {"nominal": 1}}},
                       headers=admin)
    assert r.status_code == 200, r.text
    r = submit(env, member, tiny(priority=50))
    assert r.status_code == 403
    assert "limit of 10" in r.json()["error"]["message"] and r.json()["error"]["details"]["max_priority"] == 10
    assert submit(env, member, tiny(priority=10)).status_code == 201
    assert submit(env, admin, tiny(team="alpha", priority=900)).status_code == 201  # admins set any


def test_quotas_are_admin_written_and_members_read_their_own(env: Env, admin: dict[str, str]) -> None:
    cpu_pool(env, admin)
    env.token("member", team="beta")
    alpha = env.headers(env.token("member", team="alpha"))
    quota = {"weight": 2.0, "max_priority": 50, "flavors": {"cpu": {"nominal": 1, "borrowing_limit": 1}}}
    assert env.client.put("/v1/teams/alpha/quota", json=quota, headers=alpha).status_code == 403
    assert env.client.put("/v1/teams/alpha/quota", json=quota, headers=admin).status_code == 200
    mine = env.client.get("/v1/teams/alpha/quota", headers=alpha).json()
    assert mine["declared"] is True and mine["quota"]["flavors"]["cpu"]["nominal"] == 1
    assert env.client.get("/v1/teams/beta/quota", headers=alpha).status_code == 404
    assert env.client.get("/v1/teams/beta/quota", headers=admin).json()["declared"] is False
    r = env.client.put("/v1/teams/alpha/quota", json={"flavors": {"H100-SXM-80GB": {"nominal": 8}}}, headers=admin)
    assert r.status_code == 422 and r.json()["error"]["fields"][0]["loc"] == "flavors.H100-SXM-80GB"
    assert "cpu" in r.json()["error"]["message"]
    r = env.client.put("/v1/teams/alpha/quota", json={"flavors": {"cpu": {"nominal": -1}}}, headers=admin)
    assert r.status_code == 422
    # a quota may be declared before the team has a member or a job: the team is created
    assert env.client.put("/v1/teams/nobody/quota", json=quota, headers=admin).status_code == 200
    assert env.client.get("/v1/teams/nobody/quota", headers=admin).json()["declared"] is True
    r = env.client.put("/v1/teams/Not_A_Label/quota", json=quota, headers=admin)
    assert r.status_code == 422 and "team" in r.text


def test_what_the_machine_has_can_be_stated_instead_of_detected(env: Env, tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    app = create_app(Settings(database_url=env.url, data_dir=tmp_path, local_gpus="H100-SXM-80GB:8"),
                     engine=env.app.state.engine)
    with TestClient(app) as client:
        admin = env.headers(env.token("admin"))
        pools = client.get("/v1/pools", headers=admin).json()
        assert [(p["name"], p["gpu"], p["gpus"], p["source"]) for p in pools] == [
            ("local", "H100-SXM-80GB", 8, "detected")]
        assert client.post("/v1/jobs", json=tiny(resources={"gpu": "H100-SXM-80GB", "gpus_per_node": 8}),
                           headers=admin).status_code == 201
        r = client.post("/v1/jobs", json=tiny(), headers=admin)  # no cpu pool on this "machine"
        assert r.status_code == 422 and "local (H100-SXM-80GB x 8)" in r.json()["error"]["message"]


def test_the_pools_file_is_loaded_at_start_and_replaces_what_it_loaded_before(env: Env, admin: dict[str, str],
                                                                             tmp_path: Path) -> None:
    from service.cli import wiring

    env.client.put("/v1/pools/by-hand", json={"backend": "slurm", "gpu": "A100-SXM-80GB", "gpus": 8}, headers=admin)
    path = tmp_path / "pools.yaml"
    path.write_text("pools:\n  - {name: cpu-a, backend: local, gpu: cpu, gpus: 2}\n"
                    "  - {name: h100, backend: slurm, gpu: H100-SXM-80GB, gpus: 64, partition: gpu}\n"
                    "teams:\n  vision: {weight: 2, flavors: {H100-SXM-80GB: {nominal: 16}}}\n")
    settings = Settings(database_url=env.url, data_dir=tmp_path, pools_file=path)
    wiring.load_pools(settings, env.app.state.sessions)
    pools = {p["name"]: p["source"] for p in env.client.get("/v1/pools", headers=admin).json()}
    assert pools == {"by-hand": "api", "cpu-a": "file", "h100": "file"}  # a declared local pool: none detected
    quota = env.client.get("/v1/teams/vision/quota", headers=admin).json()
    assert quota["declared"] and quota["quota"]["flavors"]["H100-SXM-80GB"]["nominal"] == 16
    path.write_text("pools:\n  - {name: cpu-a, backend: local, gpu: cpu, gpus: 1}\n")
    wiring.load_pools(settings, env.app.state.sessions)
    pools = {p["name"]: (p["source"], p["gpus"]) for p in env.client.get("/v1/pools", headers=admin).json()}
    assert pools == {"by-hand": ("api", 8), "cpu-a": ("file", 1)}
    path.write_text("pools:\n  - {name: cpu-a, backend: local, gpu: cpu, gpus: 0}\n")
    with pytest.raises(ValueError, match="gpus"):
        wiring.load_pools(settings, env.app.state.sessions)


@pytest.mark.parametrize(("name", "mib", "kind"), [
    ("NVIDIA H100 80GB HBM3", 81559, "H100-SXM-80GB"), ("NVIDIA H100 PCIe", 81559, "H100-PCIe-80GB"),
    ("NVIDIA H200", 143771, "H200-SXM-141GB"), ("NVIDIA A100-SXM4-40GB", 40960, "A100-SXM-40GB"),
    ("NVIDIA A100-SXM4-80GB", 81920, "A100-SXM-80GB"), ("NVIDIA L40S", 46068, "L40S-48GB"),
    ("NVIDIA GeForce RTX 4090", 24564, "RTX-4090"),
    # 94 GiB is nearest the 500 W Grand Teton entry's 95, which nvidia-smi's name cannot identify
    ("NVIDIA H100 NVL", 95830, "H100-SXM-80GB"),
])
def test_nvidia_smi_names_map_to_the_gpu_catalog(name: str, mib: int, kind: str) -> None:
    assert catalog_kind(name, mib) == kind


def test_concurrent_puts_of_one_pool_and_one_quota_all_succeed(env: Env, admin: dict[str, str], live: str) -> None:
    """An upsert: sixteen admins declaring the same pool and the same quota at once all get their answer
    (the first 201, the rest 200 or 201), never a 409 from the race to insert the row."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    def put(args: tuple[str, dict[str, Any]]) -> int:
        path, body = args
        with httpx.Client(base_url=live, headers=admin, timeout=60) as client:
            return client.put(path, json=body).status_code

    pools = [("/v1/pools/racing", {"backend": "slurm", "gpu": "cpu", "gpus": n}) for n in range(1, 17)]
    with ThreadPoolExecutor(16) as workers:
        assert set(workers.map(put, pools)) <= {200, 201}
    quotas = [("/v1/teams/racers/quota", {"weight": float(n), "flavors": {"cpu": {"nominal": 1}}})
              for n in range(1, 17)]
    with ThreadPoolExecutor(16) as workers:
        assert set(workers.map(put, quotas)) <= {200}
    got = env.client.get("/v1/teams/racers/quota", headers=admin).json()
    assert got["declared"] and 1.0 <= got["quota"]["weight"] <= 16.0
    assert 1 <= env.client.get("/v1/pools/racing", headers=admin).json()["gpus"] <= 16


def test_a_detected_pool_cannot_be_removed_and_says_how_to_replace_it(env: Env, admin: dict[str, str]) -> None:
    from service.store.pools import record_detected

    with env.app.state.sessions.begin() as session:
        [first, *_] = record_detected(session)
    r = env.client.delete(f"/v1/pools/{first.name}", headers=admin)
    assert r.status_code == 409 and "PUT /v1/pools" in r.json()["error"]["message"], r.text
    assert env.client.get(f"/v1/pools/{first.name}", headers=admin).json()["source"] == "detected"


@pytest.mark.parametrize(("path", "body", "loc"), [
    ("/v1/pools/box", {"backend": "local", "gpu": "cpu", "gpus": True}, "gpus"),
    ("/v1/pools/box", {"backend": "local", "gpu": "cpu", "gpus": "2"}, "gpus"),
    ("/v1/teams/t/quota", {"weight": True}, "weight"),
    ("/v1/teams/t/quota", {"flavors": {"cpu": {"nominal": False}}}, "flavors.cpu.nominal"),
])
def test_a_boolean_or_a_string_is_no_number(env: Env, admin: dict[str, str], path: str, body: dict[str, Any],
                                             loc: str) -> None:
    r = env.client.put(path, json=body, headers=admin)
    assert r.status_code == 422 and loc in [f["loc"] for f in r.json()["error"]["fields"]], r.text
