"""One admission cycle: the waiting jobs walked once, in admission order, each placed.

Each team's jobs are sorted once (priority descending, `submitted_at`, id) and come out in turn off
a heap of team heads keyed by admission order (`fair_share.order_key`, taken again after each job of
the team, so a team's fair share counts its admissions so far). Every job walked is placed
(`placement.Placement.place`): admitted, preempted for, or blocked with its reasons.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from operator import attrgetter

from service.scheduling.decisions import Decision, Reason
from service.scheduling.ledger import Ledger
from service.scheduling.placement import Placement
from service.scheduling.reasons import Blocked, ReasonCache, reason_of
from service.scheduling.settle import Settle
from service.scheduling.state import Snapshot, WaitingJob

#: with `settle`, how many placements between two checks of whether the cycle has settled
SETTLE_CHECK_EVERY = 64


@dataclass
class Outcome:
    """A cycle's decision, the jobs walked in order, why each waiting one of them waits (absent:
    admitted), and the ledger as the cycle left it."""

    decision: Decision
    order: list[WaitingJob]
    blocked: dict[int, list[Blocked]]
    ledger: Ledger


def run(s: Snapshot, *, reasons: bool = True, stop_at: int | None = None, settle: bool = False) -> Outcome:
    """Walk the waiting jobs in admission order and place each. `reasons`: word every waiting job's
    reasons into `decision.waiting` (else it stays empty). `stop_at` ends the walk after that job.
    `settle` skips inert jobs and ends the walk as soon as no remaining job can be admitted or
    preempt (`settle.Settle`): `order` is then only the prefix walked, and `admitted` and `preempted`
    are those of the whole walk."""
    ledger = Ledger(s)
    placement = Placement(ledger)
    queues: dict[str, list[WaitingJob]] = {}
    for j in s.waiting:
        queues.setdefault(j.team, []).append(j)
    for jobs in queues.values():  # (-priority, submitted_at, id), as two stable sorts keyed in C
        jobs.sort(key=attrgetter("submitted_at", "id"))
        jobs.sort(key=attrgetter("priority"), reverse=True)
    heads = [placement.fair.order_key(team, jobs[0], 0) for team, jobs in queues.items()]
    heapq.heapify(heads)
    order: list[WaitingJob] = []
    blocked: dict[int, list[Blocked]] = {}
    settled = Settle(ledger, placement.preemptor, queues) if settle else None
    while heads:
        if settled is not None and order and len(order) % SETTLE_CHECK_EVERY == 0 and settled.settled(heads):
            break
        *_, team, idx = heapq.heappop(heads)
        jobs = queues[team]
        j = jobs[idx]
        order.append(j)
        if settled is not None and settled.inert(j):
            blocked[j.id] = []  # it waits; its reasons are not derived
        else:
            why = placement.place(j)
            if why:
                blocked[j.id] = why
        if j.id == stop_at:
            break
        if idx + 1 < len(jobs):
            heapq.heappush(heads, placement.fair.order_key(team, jobs[idx + 1], idx + 1))
    waiting: dict[int, list[Reason]] = {}
    if reasons:
        cache: ReasonCache = {}
        waiting = {j.id: [reason_of(j, b, cache) for b in blocked[j.id]] for j in order if j.id in blocked}
    decision = Decision.model_construct(admitted=placement.admitted, preempted=placement.preempted, waiting=waiting,
                                        order=[j.id for j in order])
    return Outcome(decision, order, blocked, ledger)


__all__ = ["SETTLE_CHECK_EVERY", "Outcome", "run"]
