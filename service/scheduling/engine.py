"""Admission, preemption, "why pending" and the ETA band: pure functions of a `Snapshot`.

The entry points; each part lives in a module of its own (docs/scheduling.md has the long form):
`ledger` (capacity, usage, quotas, lending and borrowing), `fair_share` (admission order),
`placement` (admit, reserve, or why a job waits), `preemption` (victims), `settle` (when the
dispatcher's walk may stop), `cycle` (the walk), `reasons` (the words), `forecast` (the ETA band).

Pure and deterministic: no clock, no database, no randomness; the same snapshot gives the same
`Decision`, `Explanation` and `Eta`.
"""

from __future__ import annotations

from service.scheduling.cycle import run
from service.scheduling.decisions import Ahead, Decision, Eta, Explanation, Reason
from service.scheduling.forecast import band_of
from service.scheduling.reasons import ReasonCache, reason_of, with_priority_reason
from service.scheduling.state import Snapshot, WaitingJob


class UnknownJob(KeyError):
    """`explain`/`eta` for a job id that is neither waiting nor running in the snapshot."""


def admit(s: Snapshot, *, reasons: bool = True) -> Decision:
    """One admission cycle: which waiting jobs start where, which running jobs to preempt, why the rest wait.

    `reasons=False` (the dispatcher's call) gives exactly the same `admitted` and `preempted`, in
    the same order, faster: `waiting` is empty, and `order` is only the prefix of the full order
    that was walked before the cycle provably settled (no remaining job could be admitted or
    preempt). Use the default for `waiting` and the whole `order`."""
    return run(s, reasons=reasons, settle=not reasons).decision


def _waiting(s: Snapshot, job_id: int) -> WaitingJob | None:
    """The waiting job `job_id`; None when it is running; `UnknownJob` when it is neither."""
    if any(r.id == job_id for r in s.running):
        return None
    target = next((j for j in s.waiting if j.id == job_id), None)
    if target is None:
        raise UnknownJob(f"job {job_id} is neither waiting nor admitted in this snapshot")
    return target


def explain(s: Snapshot, job_id: int, viewer_team: str | None) -> Explanation:
    """Why job `job_id` waits: reasons with numbers, its position in its team and pool (1-based), the
    jobs ahead of it that compete for the same pools (the viewer's own team's listed, other teams'
    only counted and summed; `viewer_team=None` is an admin and sees every one), and the ETA band.
    Raises `UnknownJob` when the job is neither waiting nor running. `queue_view` gives every waiting
    job's explanation from one cycle, equal to this one's."""
    target = _waiting(s, job_id)
    if target is None:
        return Explanation(status="admitted", admitted=True,
                           eta=Eta(earliest_s=0.0, latest_s=0.0, method="already admitted"))
    out = run(s, reasons=False, stop_at=job_id)
    blocked = out.blocked.get(job_id)
    ahead = out.order[:-1]
    mine = set(out.ledger.pools_for(target.backend, target.gpu, target.pool))
    competing = [a for a in ahead if a.gpu == target.gpu and not mine.isdisjoint(
        out.ledger.pools_for(a.backend, a.gpu, a.pool))]
    listed: list[Ahead] = []
    others_jobs = others_gpus = 0
    for a in competing:
        if viewer_team is None or a.team == viewer_team:
            listed.append(Ahead(job_id=a.id, team=a.team, gpus=a.gpus, priority=a.priority))
        else:
            others_jobs += 1
            others_gpus += a.gpus
    reasons: list[Reason] = []
    if blocked:
        cache: ReasonCache = {}
        waiting_ahead = [a for a in competing if a.id in out.blocked]
        reasons = with_priority_reason(target, [reason_of(target, b, cache) for b in blocked],
                                       len(waiting_ahead), sum(a.gpus for a in waiting_ahead))
    return Explanation(
        status="queued", admitted=blocked is None, reasons=reasons,
        position={"team": 1 + sum(1 for a in ahead if a.team == target.team), "pool": len(competing) + 1},
        ahead=listed, ahead_other_teams={"jobs": others_jobs, "gpus": others_gpus} if others_jobs else {},
        ahead_scope="every_team" if viewer_team is None else "team", eta=band_of(out, target))


def eta(s: Snapshot, job_id: int) -> Eta:
    """Earliest/latest seconds from `s.now` until `job_id` starts: see `service.scheduling.forecast`."""
    target = _waiting(s, job_id)
    if target is None:
        return Eta(earliest_s=0.0, latest_s=0.0, method="already admitted")
    return band_of(run(s, reasons=False, stop_at=job_id), target)


__all__ = ["UnknownJob", "admit", "eta", "explain"]
