"""A spec that cannot run is a 422 at submit naming the field and the fix, never a job that fails later."""

from __future__ import annotations

import pytest

from tests.db_fixtures import Env
from tests.specs import tiny


def _fields(env: Env, admin: dict[str, str], spec: dict) -> dict[str, str]:  # type: ignore[type-arg]
    r = env.client.post("/v1/jobs", json=spec, headers=admin)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_spec"
    assert env.client.get("/v1/jobs", headers=admin).json()["items"] == []  # nothing was queued
    return {f["loc"]: f["message"] for f in error["fields"]}


@pytest.mark.parametrize(("backend", "loc", "words"), [
    ({"kind": "slurm", "sbatch": ["-x"]}, "backend.sbatch", "use the long form --name"),
    ({"kind": "slurm", "sbatch": ["--nodes=4"]}, "backend.sbatch", "shardctl sets --nodes itself"),
    ({"kind": "slurm", "time_limit": "3h"}, "backend.time_limit", "e.g. 02:00:00"),
    ({"kind": "kubernetes", "tolerations": [{"key": "gpu", "effect": "Sometimes"}]},
     "backend.tolerations.0.effect", "NoSchedule"),
    ({"kind": "kubernetes", "tolerations": [{"keey": "gpu"}]}, "backend.tolerations.0.keey", "not permitted"),
    ({"kind": "kubernetes", "namespace": "Team_A"}, "backend.namespace", "lower-case letters"),
    ({"kind": "k8s"}, "backend", "one of local, slurm, kubernetes"),
    ({"kind": "local", "partition": "gpu"}, "backend.partition", "not permitted"),
])
def test_backend_options_are_checked_at_submit(env: Env, admin: dict[str, str], backend: dict,  # type: ignore[type-arg]
                                               loc: str, words: str) -> None:
    fields = _fields(env, admin, tiny(backend=backend))
    assert words in fields[loc], fields


def test_names_and_teams_are_explained_in_words(env: Env, admin: dict[str, str]) -> None:
    fields = _fields(env, admin, tiny(name="-run", team="ML_Infra"))
    assert "letters, digits" in fields["name"] and "pattern" not in fields["name"]
    assert "lower-case letters" in fields["team"] and "^[a-z" not in fields["team"]


def test_a_backend_the_server_does_not_run_is_refused_at_submit(env: Env, admin: dict[str, str]) -> None:
    env.app.state.configured_backends = frozenset({"local"})  # what `serve` on a laptop wires
    fields = _fields(env, admin, tiny(backend={"kind": "kubernetes"}))
    assert "not configured on this server; configured: local" in fields["backend.kind"]
    r = env.client.post("/v1/plans", json=tiny(backend={"kind": "slurm"}), headers=admin)
    assert r.status_code == 422 and r.json()["error"]["details"]["configured_backends"] == ["local"]
    assert env.client.post("/v1/jobs", json=tiny(), headers=admin).status_code == 201


def test_an_inline_gpu_error_names_the_field_not_the_union(env: Env, admin: dict[str, str]) -> None:
    spec = tiny(resources={"gpu": {"name": "H100-SXM-80GB", "memory_gib": -1}})
    fields = _fields(env, admin, spec)
    assert list(fields) == ["resources.gpu.memory_gib"], fields
    fields = _fields(env, admin, tiny(resources={"gpu": 5}))
    assert fields == {"resources.gpu": "Input should be a valid string"}


@pytest.mark.parametrize(("variables", "words"), [
    ({"A=B": "1"}, "no '='"),
    ({"9LIVES": "1"}, "not starting with a digit"),
    ({"WITH SPACE": "1"}, "is not an environment variable name"),
])
def test_an_env_no_process_can_carry_is_refused_at_submit(env: Env, admin: dict[str, str],
                                                         variables: dict[str, str], words: str) -> None:
    """Such a name used to be accepted, then failed three attempts as `lost` with an empty log tail."""
    fields = _fields(env, admin, tiny(entrypoint={"command": ["python", "-c", "pass"], "env": variables}))
    assert words in fields["entrypoint.env"], fields
