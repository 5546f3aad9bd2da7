"""Placing one waiting job: admit it, preempt for it, or say why it waits (and reserve for it).

A job is admitted when a pool it may use has its GPUs free (pool free minus what earlier jobs
reserve) and its team's quota for that GPU kind allows it: its own `nominal`, plus up to
`borrowing_limit` more taken from what others lend. Backfill: a job that does not fit is skipped
and later jobs may start, unless it has waited `reserve_after_s` (since submission, or since its
backoff ended): then it reserves what it waits for (pool GPUs, its team's headroom, lendable quota)
and later jobs may not take them. A job that waits while GPUs being released would make room for
it reserves them and preempts no one.
"""

from __future__ import annotations

from service.scheduling.decisions import Admission, Preemption, ReasonCode
from service.scheduling.fair_share import FairShare
from service.scheduling.ledger import Ledger
from service.scheduling.preemption import Preemptor
from service.scheduling.reasons import Blocked
from service.scheduling.state import WaitingJob


class Placement:
    """One cycle's placements, in the order they are made: `admitted` and `preempted` grow as
    `place` admits and preempts."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.fair = FairShare(ledger)
        self.preemptor = Preemptor(ledger)
        self.admitted: list[Admission] = []
        self.preempted: list[Preemption] = []

    def place(self, j: WaitingJob) -> list[Blocked] | None:
        """Admit `j` (None), or preempt for it, or say why it waits (and reserve for it when it has
        waited long); a job that waits gets at least one reason."""
        led = self.ledger
        now = led.s.now
        if j.not_before is not None and j.not_before > now:
            return [Blocked(ReasonCode.BACKOFF, 0, 0, f"{j.not_before - now:.0f}")]
        long_wait = now - max(j.submitted_at, j.not_before or j.submitted_at) >= led.s.reserve_after_s
        big_enough, preemptible_pools, largest, any_pool = led.fit(j)
        if not big_enough:
            return [Blocked(ReasonCode.NO_MATCHING_POOL, largest, largest, "too small" if any_pool else "none")]
        ever = led.ever_limit(j.team, j.gpu)
        if j.gpus > ever:
            return [Blocked(ReasonCode.EXCEEDS_TEAM_LIMIT, ever, ever)]
        qb = led.quota_block(j)
        pool = led.best_pool(big_enough, j.gpus)
        if qb is None and pool is not None:
            self.admitted.append(Admission.model_construct(job_id=j.id, pool=pool, borrowed=led.admit(j, pool)))
            self.fair.admitted(j.team, j.gpu)
            return None
        # Blocked: say why, then wait for what is being released, or preempt, or reserve.
        why: list[Blocked] = []
        if qb is not None:
            if (led.lend_res[j.gpu] or led.team_res.get((j.team, j.gpu))) and led.quota_block(
                    j, ignore_res=True) is None:
                why.append(Blocked(ReasonCode.WAITING_FOR_PRIORITY, qb.available, qb.limit, "quota held"))
            else:
                why.append(qb)
        roomiest = led.roomiest(big_enough)
        room = max(0, led.room(roomiest))
        if pool is None:
            size = led.pools[roomiest].gpus
            if led.best_pool(big_enough, j.gpus, ignore_res=True) is not None:
                why.append(Blocked(ReasonCode.WAITING_FOR_PRIORITY, room, size, f"pool held:{roomiest}"))
            else:
                why.append(Blocked(ReasonCode.WAITING_FOR_CAPACITY, room, size,
                                   f"pool:{roomiest}" + (";quota" if qb else "")))
        if led.release_makes_room(j, big_enough):
            for b in why:
                b.detail += ";releasing"
            led.reserve(j, roomiest, qb is not None)
            return why
        if preemptible_pools:
            got = self.preemptor.try_preempt(j, big_enough)
            if got is not None:
                victims, reason = got
                self.preempted += [Preemption.model_construct(victim=v.id, by=j.id, reason=reason) for v in victims]
                for b in why:
                    b.detail += ";preempting"
                return why
        if long_wait and ((room > 0 and pool is None) or qb is not None):
            led.reserve(j, roomiest if pool is None and room > 0 else None, qb is not None)
        return why


__all__ = ["Placement"]
