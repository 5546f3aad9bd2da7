"""The API pod as the chart configures it: the rendered container's own command line (`shardctl serve`
with its flags) and environment (the admin token from the chart's Secret, settings, the mounted pools
file) start a real server process, and the chart's `helm test` script, run as the test Pod would run it,
passes against it: /healthz, then a tiny spec planned with the bootstrap admin token.

Stand-ins for the cluster: the listening address is 127.0.0.1 on a free port instead of 0.0.0.0:8686,
mounts are folders under tmp_path, the in-cluster service account is a kubeconfig for the fake API
server (the default SQLite install runs the dispatcher inside serve, and the Kubernetes backend renders
the plan's launch preview)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.deploy.chart import env_of, one, render
from tests.deploy.podenv import container_environment, kubeconfig
from tests.k8s.fake_apiserver import FakeApiServer

BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _replace_flag(command: list[str], flag: str, value: str) -> list[str]:
    i = command.index(flag)
    return [*command[: i + 1], value, *command[i + 2:]]


@pytest.fixture
def cluster() -> Iterator[FakeApiServer]:
    server = FakeApiServer().start()
    yield server
    server.go_down()


def test_api_pod_serves_and_passes_the_helm_test(cluster: FakeApiServer, tmp_path: Path) -> None:
    objs = render()
    api = one(objs, "Deployment", "shardctl")
    container = api["spec"]["template"]["spec"]["containers"][0]
    variables = container_environment(objs, "Deployment", "shardctl", root=tmp_path / "pod",
                                      kube=kubeconfig(tmp_path / "kubeconfig", cluster.host))
    token = variables["SHARDCTL_BOOTSTRAP_ADMIN_TOKEN"]
    port = _free_port()
    command = _replace_flag(_replace_flag(container["command"], "--host", "127.0.0.1"), "--port", str(port))
    assert command[0] == "shardctl"
    base_env = {"PATH": f"{BIN}:{os.environ.get('PATH', '')}", "HOME": str(tmp_path / "home")}
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen([str(BIN / "shardctl"), *command[1:]], env={**base_env, **variables},
                              stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60  # a start deadline, not a timing assertion
        while True:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.2)

        test_pod = one(objs, "Pod")
        tc = test_pod["spec"]["containers"][0]
        assert tc["command"][:2] == ["python", "-c"]
        pod_env = {k: v for k, v in env_of(tc).items() if isinstance(v, str)}
        pod_env["API"] = url  # stands in for the Service's address the Pod is given
        assert env_of(tc)["ADMIN_TOKEN"] == {"secretKeyRef": {"name": "shardctl-admin", "key": "token"}}
        pod_env["ADMIN_TOKEN"] = token
        run = subprocess.run([sys.executable, "-c", tc["command"][2]], env={**base_env, **pod_env},
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stdout + run.stderr
        assert "GET /healthz 200" in run.stdout and "POST /v1/plans 200" in run.stdout
        # The generated token is an admin's; a wrong one is refused (so the script's success means something).
        run = subprocess.run([sys.executable, "-c", tc["command"][2]],
                             env={**base_env, **pod_env, "ADMIN_TOKEN": token[:-4] + "xxxx"},
                             capture_output=True, text=True, timeout=120)
        assert run.returncode != 0 and "POST /v1/plans 401" in run.stdout
        # The token never reaches the server's log.
        assert token not in (tmp_path / "serve.log").read_text()
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()
