"""Small specs the API tests submit (they plan in milliseconds)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from service.jobenv import JobEnv
from service.planner import Plan, plan
from service.spec import TrainingSpec
from tests.conftest import deep_merge
from workers.backends.base import LaunchRequest

TINY: dict[str, Any] = {
    "name": "tiny",
    "model": {"preset": "llama-tiny"},
    "training": {"global_batch": 8, "precision": "fp32", "steps": 5},
    "resources": {"gpu": "cpu", "gpus_per_node": 2, "nodes": 1},
}


def tiny(**sections: Any) -> dict[str, Any]:
    return deep_merge(TINY, sections)


def launch_request(name: str, command: list[str], *, nodes: int = 1, procs: int = 1, job_id: int = 1,
                   attempt: int = 1, backend: dict[str, Any] | None = None, team: str = "t",
                   user_env: dict[str, str] | None = None, image: str | None = None,
                   token: str | None = None) -> LaunchRequest:
    """A launch request as the dispatcher builds it, for the tiny spec's plan, with the given world."""
    spec = TrainingSpec.model_validate(tiny(backend=backend or {}))
    job = JobEnv(job_id=job_id, attempt=attempt, plan=tiny_plan(), token=token)
    return LaunchRequest(job=job, name=name, team=team, nodes=nodes, procs_per_node=procs, gpus_per_proc=0,
                         command=command, user_env=user_env or {}, image=image, options=spec.backend)


@lru_cache(maxsize=1)
def tiny_plan() -> Plan:
    return plan(TrainingSpec.model_validate(TINY))
