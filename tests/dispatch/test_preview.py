"""`POST /v1/plans` shows what the backend would be sent, without creating anything."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.settings import Settings
from service.store.db import make_engine
from tests.db_fixtures import Env
from tests.specs import tiny
from workers.backends.local import LocalBackend
from workers.dispatch.request import launch_preview


def test_plans_render_the_launch_request_when_a_dispatcher_is_wired(env: Env, tmp_path: Path) -> None:
    admin = env.headers(env.token("admin"))
    assert env.client.post("/v1/plans", json=tiny(), headers=admin).json()["launch"] is None
    app = create_app(Settings(database_url=env.url, data_dir=tmp_path), engine=make_engine(env.url),
                     launch_preview=launch_preview({"local": LocalBackend(tmp_path / "local")}, "http://x"),
                     configured_backends=["local"])
    with TestClient(app) as client:
        body = client.post("/v1/plans", json=tiny(entrypoint={"command": ["python", "-m", "workers.runtime"],
                                                                "env": {"DB_PASSWORD": "hunter2", "MODE": "a"}}),
                           headers=admin).json()
        other = client.post("/v1/plans", json=tiny(backend={"kind": "slurm"}), headers=admin)
    launch = body["launch"]
    assert launch["backend"] == "local" and launch["name"] == "shardctl-0-1"
    (command,) = launch["content"]["commands"]
    assert "--nproc-per-node=2" in command and command[-3:] == ["python", "-m", "workers.runtime"]
    shown = launch["content"]["env"]
    assert shown["SHARDCTL_JOB_TOKEN"] == shown["DB_PASSWORD"] == "<redacted>" and shown["MODE"] == "a"
    assert other.status_code == 422 and "configured: local" in other.json()["error"]["message"]
    assert env.client.get("/v1/jobs", headers=admin).json()["items"] == []


@pytest.mark.parametrize("kind", ["local", "slurm", "kubernetes"])
def test_every_backends_preview_redacts_credentials_by_value(kind: str, tmp_path: Path) -> None:
    from kubernetes import client

    from service.planner import plan
    from service.spec import TrainingSpec
    from workers.backends.kubernetes import KubernetesBackend
    from workers.backends.slurm import SlurmBackend

    backends = {"local": lambda: LocalBackend(tmp_path / "local"),
                "slurm": lambda: SlurmBackend(folder=tmp_path / "slurm"),
                "kubernetes": lambda: KubernetesBackend(client.ApiClient(client.Configuration(host="http://127.0.0.1:9")))}
    spec = TrainingSpec.model_validate(tiny(backend={"kind": kind}, entrypoint={
        "command": ["python", "train.py", "--data", "s3://reader:hunter2@bucket/x"], "image": "example.org/train:1",
        "env": {"DATA_URL": "s3://reader:hunter2@bucket/x"}}))
    preview = launch_preview({kind: backends[kind]()}, "http://x")(spec, plan(spec))
    shown = str(preview)
    assert preview is not None and preview["backend"] == kind
    assert "hunter2" not in shown and "s3://reader:<redacted>@bucket/x" in shown
