"""Large deterministic scheduling snapshots: `make_snapshot` builds a saturated queue of a given size
from a seed (10,000 waiting jobs, 100 teams in 10 groups, 20 pools by default). The engine's tests use
it, and `benchmarks/admission.py` times the engine on it."""

from __future__ import annotations

import random

from service.scheduling.model import FlavorQuota, Pool, PreemptionPolicy, TeamQuota
from service.scheduling.state import RunningJob, Snapshot, WaitingJob

KINDS = ["H100-SXM-80GB", "A100-SXM-80GB", "L40S-48GB", "H200-SXM-141GB"]
POLICIES = [PreemptionPolicy.RECLAIM, PreemptionPolicy.LOWER_PRIORITY, PreemptionPolicy.NEVER]
NOW = 1_000_000.0


def make_snapshot(jobs: int = 10_000, teams: int = 100, pools: int = 20, seed: int = 12,
                  presorted: bool = True) -> Snapshot:
    """A deterministic, saturated snapshot of the given size; `presorted`: its waiting jobs in
    admission-key order, as `build_snapshot` gives them (else by id)."""
    rng = random.Random(seed)
    pool_list = [Pool(name=f"pool-{i:02d}", backend="kubernetes" if i % 2 else "slurm", gpu=KINDS[i % len(KINDS)],
                      gpus=rng.choice([64, 128, 256, 512]), preemption=POLICIES[i % len(POLICIES)])
                 for i in range(pools)]
    capacity = {k: sum(p.gpus for p in pool_list if p.gpu == k) for k in KINDS}
    names = [f"team-{i:03d}" for i in range(teams)]
    quotas: dict[str, TeamQuota] = {}
    for i, name in enumerate(names):
        kinds = rng.sample(KINDS, 2)
        quotas[name] = TeamQuota(
            weight=rng.choice([0.5, 1.0, 1.0, 2.0]), group=f"org-{i % 10}",
            flavors={k: FlavorQuota(nominal=capacity[k] // teams, borrowing_limit=rng.choice([None, 16, 64]),
                                    lending_limit=rng.choice([None, capacity[k] // (2 * teams)])) for k in kinds})
    running: list[RunningJob] = []
    job_id = 0
    for p in pool_list:
        left = int(p.gpus * 0.95)
        while left > 0:
            job_id += 1
            team = rng.choice(names)
            gpus = min(left, rng.choice([1, 2, 4, 8]))
            left -= gpus
            start = NOW - rng.uniform(0, 7200)
            running.append(RunningJob(
                id=job_id, team=team, pool=p.name, gpu=p.gpu, gpus=gpus, priority=rng.choice([0, 0, 1]),
                admitted_at=start - 5, started_at=start, checkpoint_at=start + rng.uniform(0, NOW - start),
                remaining_s=rng.choice([None, rng.uniform(60, 36000)])))
    waiting: list[WaitingJob] = []
    for _ in range(jobs):
        job_id += 1
        team = rng.choice(names)
        kind = rng.choice(list(quotas[team].flavors))
        backend = rng.choice([p.backend.value for p in pool_list if p.gpu == kind])
        waiting.append(WaitingJob(
            id=job_id, team=team, backend=backend, gpu=kind, gpus=rng.choice([1, 1, 2, 4, 8, 16]),
            priority=rng.choice([0, 0, 0, 1, 2]), submitted_at=NOW - rng.uniform(0, 86400),
            predicted_s=rng.choice([None, rng.uniform(600, 36000)]),
            not_before=NOW + 60 if rng.random() < 0.02 else None))
    usage = {t: {k: rng.uniform(0, 1e6) for k in quotas[t].flavors} for t in names}
    if presorted:  # as the dispatcher's snapshot comes: build_snapshot reads the queue in admission-key order
        waiting.sort(key=lambda j: (-j.priority, j.submitted_at, j.id))
    return Snapshot(now=NOW, pools=pool_list, quotas=quotas, running=running, waiting=waiting, usage=usage)
