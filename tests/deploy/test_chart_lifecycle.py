"""What happens around the chart's pods: the admin token survives `helm upgrade` (the template's
`lookup` reads the live Secret, here from the fake API server, through the real Helm engine), and the
pre-install/pre-upgrade hook Job's command and environment migrate an empty database."""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Iterator
from pathlib import Path

import helm_python as helm
import pytest
import yaml
from alembic.script import ScriptDirectory
from typer.testing import CliRunner

from service.cli.main import app
from service.store import migrate
from tests.deploy.chart import CHART, env_of, one, pod_spec, render, scenario
from tests.k8s.fake_apiserver import FakeApiServer

NS = "shardctl-system"


@pytest.fixture
def cluster() -> Iterator[FakeApiServer]:
    server = FakeApiServer().start()
    yield server
    server.go_down()


def _admin_token(cluster: FakeApiServer, *, upgrade: bool) -> str:
    config = helm.Config(kube_apiserver=cluster.host, kube_token="not-a-real-token", namespace=NS)
    try:
        with helm.Chart.load(CHART) as chart:
            out = config.render(chart, None, name="shardctl", namespace=NS, is_upgrade=upgrade, is_install=not upgrade)
    finally:
        config.close()
    secret = yaml.safe_load(out["shardctl/templates/secret-admin.yaml"])
    return base64.b64decode(secret["data"]["token"]).decode()


def test_admin_token_is_generated_once_and_kept_across_upgrades(cluster: FakeApiServer) -> None:
    first, second = _admin_token(cluster, upgrade=False), _admin_token(cluster, upgrade=False)
    # No Secret yet: a fresh random token, in the form SHARDCTL_BOOTSTRAP_ADMIN_TOKEN takes.
    assert re.fullmatch(r"shc_[A-Za-z0-9]{16}_[A-Za-z0-9]{48}", first) and first != second
    # The install created it; an upgrade finds it and keeps its token.
    cluster._store("secrets", NS, {"apiVersion": "v1", "kind": "Secret",
                                   "metadata": {"name": "shardctl-admin", "namespace": NS},
                                   "data": {"token": base64.b64encode(first.encode()).decode()}})
    assert _admin_token(cluster, upgrade=True) == first
    assert cluster.count("GET", rf"/api/v1/namespaces/{NS}/secrets/shardctl-admin$") >= 1


def test_migration_hook_migrates_an_empty_database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job = one(render(scenario("postgres")), "Job")
    container = pod_spec(job)["containers"][0]
    url = f"sqlite:///{tmp_path / 'fresh.db'}"  # stands in for the URL in the operator's Secret
    for name in [n for n in os.environ if n.startswith("SHARDCTL_")]:
        monkeypatch.delenv(name)
    for name, value in env_of(container).items():
        if name == "SHARDCTL_DATABASE_URL":
            assert value == {"secretKeyRef": {"name": "shardctl-postgres", "key": "DATABASE_URL"}}
            value = url
        elif name == "SHARDCTL_DATA_DIR":
            value = str(tmp_path / "data")
        monkeypatch.setenv(name, value)
    assert container["command"][0] == "shardctl"
    result = CliRunner().invoke(app, container["command"][1:])
    assert result.exit_code == 0, result.output
    head = ScriptDirectory.from_config(migrate.alembic_config(url)).get_current_head()
    assert head is not None and migrate.current_revision(url) == head
