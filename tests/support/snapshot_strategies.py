"""Hypothesis strategies for scheduling snapshots: `snapshots` (up to 3 Slurm pools of two GPU kinds,
4 teams, 12 waiting jobs) and `busy_snapshots`, a richer one (pins, backoffs, jobs being released,
groups, both backends)."""

from __future__ import annotations

from hypothesis import strategies as st

from service.scheduling.model import FlavorQuota, Pool, PreemptionPolicy, TeamQuota
from service.scheduling.state import RunningJob, Snapshot, WaitingJob
from tests.scheduling.builders import NOW

KINDS = ["H100-SXM-80GB", "L40S-48GB"]


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    """Up to 3 Slurm pools of the two kinds, up to 4 teams (in no group or one), up to 12 waiting jobs,
    and running jobs filling some of each pool."""
    kinds = KINDS
    policies = list(PreemptionPolicy)
    pools = [Pool.model_validate({"name": f"p{i}", "backend": "slurm", "gpu": kinds[i % 2],
                                  "gpus": draw(st.integers(1, 12)), "preemption": draw(st.sampled_from(policies))})
             for i in range(draw(st.integers(1, 3)))]
    teams = ["a", "b", "c", "d"][:draw(st.integers(1, 4))]
    quotas = {t: TeamQuota(weight=draw(st.sampled_from([0.0, 1.0, 2.0])), group=draw(st.sampled_from([None, "x"])),
                           flavors={k: FlavorQuota(nominal=draw(st.integers(0, 8)),
                                                   borrowing_limit=draw(st.one_of(st.none(), st.integers(0, 6))),
                                                   lending_limit=draw(st.one_of(st.none(), st.integers(0, 6))))
                                    for k in kinds if draw(st.booleans())})
              for t in teams}
    running: list[RunningJob] = []
    jid = 100
    for p in pools:
        left = p.gpus
        while left > 0 and draw(st.booleans()):
            g = draw(st.integers(1, left))
            left -= g
            jid += 1
            started = NOW - draw(st.integers(0, 3000))
            running.append(RunningJob(id=jid, team=draw(st.sampled_from(teams)), pool=p.name, gpu=p.gpu, gpus=g,
                                      priority=draw(st.integers(0, 2)), admitted_at=started, started_at=started,
                                      checkpoint_at=started + draw(st.integers(0, 100)),
                                      preemptible=draw(st.booleans())))
    waiting = [WaitingJob(id=i, team=draw(st.sampled_from(teams)), backend="slurm", gpu=draw(st.sampled_from(kinds)),
                          gpus=draw(st.integers(1, 8)), priority=draw(st.integers(0, 2)),
                          submitted_at=NOW - draw(st.integers(0, 2000)))
               for i in range(1, draw(st.integers(0, 12)) + 1)]
    return Snapshot(now=NOW, pools=pools, quotas=quotas, running=running, waiting=waiting)


@st.composite
def busy_snapshots(draw: st.DrawFn) -> Snapshot:
    """Up to 5 pools on two backends, 6 teams in up to two groups, up to 70 waiting jobs (some
    pinned, some in backoff, some new), running jobs of which some are being released."""
    policies = list(PreemptionPolicy)
    pools = [Pool.model_validate({"name": f"p{i}", "backend": ("slurm", "kubernetes")[draw(st.integers(0, 1))],
                                  "gpu": KINDS[i % 2], "gpus": draw(st.integers(1, 16)),
                                  "preemption": draw(st.sampled_from(policies))})
             for i in range(draw(st.integers(1, 5)))]
    teams = [f"t{i}" for i in range(draw(st.integers(1, 6)))]
    quotas = {t: TeamQuota(weight=draw(st.sampled_from([0.0, 0.5, 1.0, 2.0])),
                           group=draw(st.sampled_from([None, "x", "y"])),
                           flavors={k: FlavorQuota(nominal=draw(st.integers(0, 10)),
                                                   borrowing_limit=draw(st.one_of(st.none(), st.integers(0, 8))),
                                                   lending_limit=draw(st.one_of(st.none(), st.integers(0, 8))))
                                    for k in KINDS if draw(st.booleans())})
              for t in teams if draw(st.integers(0, 5))}
    running: list[RunningJob] = []
    jid = 1000
    for p in pools:
        left = p.gpus
        while left > 0 and draw(st.integers(0, 5)):
            g = draw(st.integers(1, min(left, 4)))
            left -= g
            jid += 1
            started = NOW - draw(st.integers(0, 4000))
            running.append(RunningJob(
                id=jid, team=draw(st.sampled_from(teams)), pool=p.name, gpu=p.gpu, gpus=g,
                priority=draw(st.integers(0, 2)), admitted_at=started, started_at=started,
                checkpoint_at=started + draw(st.integers(0, 100)), preemptible=draw(st.integers(0, 6)) > 0))
    waiting = []
    for i in range(1, draw(st.integers(0, 70)) + 1):
        kind = draw(st.sampled_from(KINDS))
        same_kind = [p for p in pools if p.gpu == kind]
        backend = draw(st.sampled_from([p.backend.value for p in same_kind])) if same_kind else "slurm"
        pin = draw(st.sampled_from([None, None, None, *[p.name for p in same_kind]]))
        waiting.append(WaitingJob(
            id=i, team=draw(st.sampled_from(teams)), backend=backend, gpu=kind, gpus=draw(st.integers(1, 8)),
            priority=draw(st.integers(0, 2)), submitted_at=NOW - draw(st.sampled_from([10, 500, 1000, 5000])),
            pool=pin, not_before=draw(st.sampled_from([None, None, None, NOW + 60, NOW - 60]))))
    usage = {t: {k: float(draw(st.integers(0, 1000))) for k in KINDS} for t in teams if draw(st.booleans())}
    return Snapshot(now=NOW, pools=pools, quotas=quotas, running=running, waiting=waiting, usage=usage,
                    reserve_after_s=draw(st.sampled_from([0.0, 900.0, 1e9])))
