"""`shardctl pools`, `quota`, `usage` and `why` against a live API."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tests.db_fixtures import Env
from tests.specs import tiny
from workers.backends.local import LocalBackend
from workers.dispatch.context import DispatcherConfig
from workers.dispatcher import Dispatcher


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


def test_an_admins_why_names_each_job_ahead_with_its_team(admin_cli: Callable[..., tuple[int, str]], env: Env,
                                                           tmp_path: Path) -> None:
    """A member sees their own team's jobs ahead by name and others' only counted; an admin sees every
    team's, each with its team, never under "ahead from your team"."""
    assert admin_cli("pools", "set", "cpu-box", "--backend", "local", "--gpu", "cpu", "--gpus", "1")[0] == 0
    admin = env.headers(env.token("admin"))
    member = env.headers(env.token("member", team="alpha"))
    env.token("member", team="beta")
    one = {"resources": {"gpus_per_node": 1}}
    first = env.client.post("/v1/jobs", json=tiny(name="holds", team="alpha", **one), headers=admin).json()["id"]
    Dispatcher(env.app.state.sessions, {"local": LocalBackend(tmp_path / "local")}, DispatcherConfig()).lease()
    beta = env.client.post("/v1/jobs", json=tiny(name="b", team="beta", **one), headers=admin).json()["id"]
    alpha = env.client.post("/v1/jobs", json=tiny(name="a", team="alpha", **one), headers=admin).json()["id"]
    code, out = admin_cli("why", str(alpha), "--json")
    explained = json.loads(out)
    assert code == 0 and explained["ahead_scope"] == "every_team", out
    assert {a["job_id"]: a["team"] for a in explained["ahead"]} == {beta: "beta"}
    code, out = admin_cli("why", str(alpha))
    assert code == 0 and f"ahead: job {beta} of beta" in out and "from your team" not in out, out
    mine = env.client.get(f"/v1/jobs/{alpha}/explain", headers=member).json()
    assert mine["ahead_scope"] == "team" and mine["ahead"] == [] and mine["ahead_other_teams"]["jobs"] == 1
    assert first != beta
