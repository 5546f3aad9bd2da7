"""The dispatcher's walk: jobs it may skip, and when it may stop.

The dispatcher's call (`admit(s, reasons=False)`) skips each job that is inert (`Settle.inert`:
placing it would provably change nothing) and stops walking the queue once the cycle has settled
(`Settle.settled`): no remaining job can be admitted or preempt, so nothing remaining can change
`admitted` or `preempted` (reservations may, but only what later jobs see).

Every test here only ever gets truer within a cycle (unreserved room and quota headroom only
shrink, releases only grow, a pool preempts at most once), so a job found inert stays inert and a
pool found dead stays dead. Settled, per pool, conservatively: its unreserved room is below the
smallest waiting job's size, and it may not preempt (policy never, preempting already, or no team
with jobs of its kind left can: within its nominal or its group's with the smallest size, or, in a
lower_priority pool, with a lower-priority job of its own there, and even then only if every
eligible victim together, with the room, covers the smallest size).
"""

from __future__ import annotations

from service.scheduling.fair_share import OrderKey
from service.scheduling.ledger import INF, Ledger
from service.scheduling.model import PreemptionPolicy
from service.scheduling.preemption import Preemptor
from service.scheduling.state import WaitingJob


class Settle:
    """The settle test of one cycle over its teams' queues (each in admission-key order)."""

    def __init__(self, ledger: Ledger, preemptor: Preemptor, queues: dict[str, list[WaitingJob]]) -> None:
        self.ledger = ledger
        self.preemptor = preemptor
        self.queues = queues
        self.gmin = min((j.gpus for jobs in queues.values() for j in jobs), default=1)
        self.last_of_kind: dict[str, dict[str, int]] = {}  # team -> kind -> index of its last job of it
        for team, jobs in queues.items():
            last = self.last_of_kind[team] = {}
            for i, j in enumerate(jobs):
                last[j.gpu] = i
        self.closed: set[str] = {p.name for p in ledger.pools.values() if p.preemption == PreemptionPolicy.NEVER}
        self.safe: set[tuple[str, str]] = set()  # (team, reclaim pool): none of its jobs left preempts there
        self.resume: dict[tuple[str, str], int] = {}  # (team, reclaim pool): first job not found safe

    def inert(self, j: WaitingJob) -> bool:
        """True only when placing `j` would provably change nothing: no admission, no preemption, no
        reservation (False says nothing).

        - every pool big enough for it has no unreserved room (no admission, no pool to reserve);
        - it reserves no quota: its team's quota admits it, or the team has no finite borrowing
          headroom left and the kind no lendable quota left;
        - it may preempt in none of its pools: each is preempting already, or it neither reclaims
          nor is in a lower_priority pool, or every eligible victim together would not make room;
          or it would wait for GPUs being released instead."""
        led = self.ledger
        if j.not_before is not None and j.not_before > led.s.now:
            return False  # the placement answers backoff at once
        big, preemptible, _, _ = led.fit(j)
        if not big or j.gpus > led.ever_limit(j.team, j.gpu):
            return False  # the placement answers no_matching_pool or exceeds_team_limit at once
        free, reserved = led.free, led.reserved
        for n in big:
            if free[n] - reserved[n] > 0:
                return False
        key = (j.team, j.gpu)
        q = led.limit(j.team, j.gpu)
        if ((q.borrow != INF and q.nominal + q.borrow - led.usage.get(key, 0) - led.team_res.get(key, 0) > 0)
                or led.free_lend[j.gpu] - led.lend_res[j.gpu] > 0) and led.quota_block(j) is not None:
            return False  # quota blocks it, and there is quota it may reserve
        reclaims: bool | None = None
        for n in preemptible:
            if n in self.preemptor.preempting:
                continue
            if reclaims is None:
                reclaims = led.within_nominal(j.team, j.gpu, j.gpus) or led.within_group_nominal(
                    j.team, j.gpu, j.gpus)
            lower = led.pools[n].preemption == PreemptionPolicy.LOWER_PRIORITY
            if (reclaims or lower) and self.preemptor.may_free_enough(j.gpus, j.team, j.priority, n, lower, reclaims):
                return led.release_makes_room(j, big)  # it might preempt, unless it waits for a release
        return True

    def _waits_for_release(self, team: str, idx: int, name: str) -> bool:
        """Whether no job of `team` left (from `idx`) can preempt in reclaim pool `name`, now or later
        in the cycle: none fits in its group's nominal headroom, and each either does not fit in its
        team's nominal headroom (so it never reclaims), or does while no pool it fits has unreserved
        room and one is releasing enough for it, so the placement waits for that release instead (its
        quota holds with what its team releases: it stays within nominal). Stays true: room and
        both headrooms only shrink, releases only grow (a job that drops out of its nominal
        headroom does not reclaim then, as it fits in no group headroom)."""
        led = self.ledger
        now = led.s.now
        kind = led.pools[name].gpu
        size = led.pools[name].gpus
        jobs = self.queues[team]
        for i in range(max(idx, self.resume.get((team, name), idx)), len(jobs)):
            j = jobs[i]
            g = j.gpus
            if j.gpu != kind or g > size or (j.not_before is not None and j.not_before > now):
                continue
            names = led.pools_for(j.backend, j.gpu, j.pool)
            if name not in names:
                continue
            if led.within_group_nominal(team, kind, g):
                self.resume[(team, name)] = i
                return False  # it may reclaim for its group, now or once its team's headroom is gone
            if not led.within_nominal(team, kind, g):
                continue  # it does not reclaim, now or later
            big = [n for n in names if led.pools[n].gpus >= g]
            if any(led.room(n) for n in big) or not any(led.releasing[n] >= g for n in big):
                self.resume[(team, name)] = i  # the jobs before it stay safe: start here next time
                return False
        return True

    def settled(self, heads: list[OrderKey]) -> bool:
        """Whether every pool is dead; `heads` holds every team with jobs left (team, next index)."""
        led, gmin = self.ledger, self.gmin
        for name, p in led.pools.items():
            if led.room(name) >= gmin and any(
                    self.last_of_kind[head[5]].get(p.gpu, -1) >= head[6] for head in heads):
                return False  # room for the smallest size, and jobs of its kind left
        for name, p in led.pools.items():
            if name in self.closed or name in self.preemptor.preempting:
                continue
            lower = p.preemption == PreemptionPolicy.LOWER_PRIORITY
            for head in heads:
                team, idx = head[5], head[6]
                if self.last_of_kind[team].get(p.gpu, -1) < idx:
                    continue  # no job of this kind left
                reclaims = led.within_nominal(team, p.gpu, gmin) or led.within_group_nominal(team, p.gpu, gmin)
                if not reclaims and not lower:
                    continue
                if reclaims and not lower and (team, name) in self.safe:
                    continue
                if reclaims and not lower and self._waits_for_release(team, idx, name):
                    self.safe.add((team, name))
                    continue
                top = self.queues[team][idx].priority  # the highest priority it has left
                if self.preemptor.may_free_enough(gmin, team, top, name, lower, reclaims):
                    return False
            self.closed.add(name)
        return True


__all__ = ["Settle"]
