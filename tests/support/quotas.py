"""Team quotas through the API on the local backend's cpu pool: a pool and quotas set up, a job spec
for a team, and a submission."""

from __future__ import annotations

from typing import Any

from tests.db_fixtures import Env
from tests.specs import tiny


def program(code: str, *, team: str, slots: int = 1, name: str = "q") -> dict[str, Any]:
    return tiny(name=name, team=team, resources={"gpus_per_node": slots},
                entrypoint={"command": ["python", "-c", code]})


def setup(env: Env, admin: dict[str, str], gpus: int, quotas: dict[str, Any]) -> dict[str, dict[str, str]]:
    r = env.client.put("/v1/pools/local", json={"backend": "local", "gpu": "cpu", "gpus": gpus}, headers=admin)
    assert r.status_code in (200, 201), r.text
    members = {}
    for team in ("alpha", "beta", "gamma"):
        members[team] = env.headers(env.token("member", team=team))
    for team, quota in quotas.items():
        assert env.client.put(f"/v1/teams/{team}/quota", json=quota, headers=admin).status_code == 200
    return members


def submit(env: Env, headers: dict[str, str], spec: dict[str, Any]) -> int:
    r = env.client.post("/v1/jobs", json=spec, headers=headers)
    assert r.status_code == 201, r.text
    return int(r.json()["id"])
