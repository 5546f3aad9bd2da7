"""`shardctl pools`, `quota`, `usage` and `why` against a live API (issue 12)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tests.db_fixtures import Env
from tests.specs import tiny
from workers.backends.local import LocalBackend
from workers.dispatcher import Dispatcher, DispatcherConfig


def test_an_admin_declares_pools_and_quotas_and_a_user_asks_why(admin_cli: Callable[..., tuple[int, str]], env: Env,
                                                                 tmp_path: Path) -> None:
    code, out = admin_cli("pools", "set", "cpu-box", "--backend", "local", "--gpu", "cpu", "--gpus", "1")
    assert code == 0 and "cpu-box: cpu x 1 on local" in out, out
    code, out = admin_cli("pools", "list")
    assert code == 0 and "cpu-box" in out and "api" in out
    env.token("member", team="alpha")
    quota = tmp_path / "quota.yaml"
    quota.write_text("max_priority: 20\nflavors: {cpu: {nominal: 1, borrowing_limit: 0}}\n")
    assert admin_cli("quota", "set", "alpha", "--file", str(quota))[0] == 0
    code, out = admin_cli("quota", "get", "alpha")
    assert code == 0 and "max priority 20" in out and "cpu: nominal 1, may borrow 0" in out, out
    admin = env.headers(env.token("admin"))
    ids = [env.client.post("/v1/jobs", json=tiny(name=f"j{i}", team="alpha", resources={"gpus_per_node": 1}),
                           headers=admin).json()["id"] for i in range(2)]
    Dispatcher(env.app.state.sessions, {"local": LocalBackend(tmp_path / "local")}, DispatcherConfig()).lease()
    code, out = admin_cli("why", str(ids[1]))
    assert code == 0 and f"job {ids[1]} (QUEUED) waits:" in out, out
    assert "quota_exceeded" in out and "position: 1 in its team, 1 for its pools" in out
    assert "starts in " in out  # the ETA band, with how it was computed
    code, out = admin_cli("usage", "alpha", "--json")
    assert code == 0 and json.loads(out)["admitted"] == {"cpu": 1}
    code, out = admin_cli("why", "424242")
    assert code == 1 and "no job 424242" in out
    code, out = admin_cli("pools", "rm", "cpu-box")
    assert code == 0 and admin_cli("pools", "rm", "cpu-box")[0] == 1
