"""Small builders for scheduling snapshots: one pool kind unless said, times in seconds."""

from __future__ import annotations

from typing import Any

from service.scheduling.model import FlavorQuota, Pool, PreemptionPolicy, TeamQuota
from service.scheduling.state import RunningJob, Snapshot, WaitingJob

GPU = "H100-SXM-80GB"
NOW = 100_000.0


def pool(name: str = "p", gpus: int = 8, policy: PreemptionPolicy = PreemptionPolicy.RECLAIM,
         gpu: str = GPU, backend: str = "slurm") -> Pool:
    return Pool.model_validate({"name": name, "backend": backend, "gpu": gpu, "gpus": gpus,
                                "preemption": policy})


def quota(nominal: int = 0, borrow: int | None = None, lend: int | None = None, weight: float = 1.0,
          group: str | None = None, gpu: str = GPU) -> TeamQuota:
    return TeamQuota(weight=weight, group=group,
                     flavors={gpu: FlavorQuota(nominal=nominal, borrowing_limit=borrow, lending_limit=lend)})


def wait(job_id: int, team: str, gpus: int = 1, *, priority: int = 0, submitted: float = NOW - 10,
         gpu: str = GPU, backend: str = "slurm", **kw: Any) -> WaitingJob:
    return WaitingJob(id=job_id, team=team, backend=backend, gpu=gpu, gpus=gpus, priority=priority,
                      submitted_at=submitted, **kw)


def run(job_id: int, team: str, gpus: int = 1, *, pool_name: str = "p", priority: int = 0,
        started: float = NOW - 3600, checkpoint: float | None = None, gpu: str = GPU, **kw: Any) -> RunningJob:
    return RunningJob(id=job_id, team=team, pool=pool_name, gpu=gpu, gpus=gpus, priority=priority,
                      admitted_at=started - 1, started_at=started, checkpoint_at=checkpoint, **kw)


def snap(pools: list[Pool], quotas: dict[str, TeamQuota], running: list[RunningJob] | None = None,
         waiting: list[WaitingJob] | None = None, **kw: Any) -> Snapshot:
    return Snapshot(now=NOW, pools=pools, quotas=quotas, running=running or [], waiting=waiting or [], **kw)
