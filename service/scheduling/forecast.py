"""The ETA band: the waiting queue of one GPU kind simulated forward, every job at once.

Contract (`forecast(...)`): the running jobs of the kind hold their pool and their team's GPUs
for `remaining_s`. Then, in admission order: a job admitted this cycle starts at once in the pool
it was given and runs `predicted_s`; every other waiting job of the kind that can ever start (a
pool big enough, within its team's limit) starts at the first moment both a pool it may use has
room and its team holds few enough GPUs, no sooner than its backoff ends, and runs `predicted_s`.
No job starts before a job ahead of it that may use one of its pools, or one of its own team's
(no backfill past a competitor), so each job's start depends only on the jobs ahead of it: the
band of a job is the same whether the simulation stops at it (`explain`) or runs the whole queue
(the queue view).

Run twice: the earliest edge with known durations shortened by `ETA_TOLERANCE` and unknown ones
taken as 0, the latest lengthened by it and unknown ones taken as `Snapshot.eta_unknown_s`.
Preemption and later arrivals are not simulated. Pure: it reads the cycle's ledger only.
`forecast_kind` runs it over a cycle's walked order, `eta_of` words one job's band as an `Eta`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from service.scheduling.cycle import Outcome
from service.scheduling.decisions import Eta
from service.scheduling.ledger import Ledger
from service.scheduling.reasons import NEVER, Blocked
from service.scheduling.state import RunningJob, Snapshot, WaitingJob

INF = math.inf
#: the ETA band: known durations run this fraction shorter (earliest) or longer (latest).
ETA_TOLERANCE = 0.2


@dataclass(frozen=True, slots=True)
class Start:
    """When one waiting job starts, in seconds from the snapshot's `now` (INF: never, as simulated),
    and what the simulation held ahead of it (for the band's `method`)."""

    earliest: float
    latest: float
    running: int  # running jobs of its kind
    ahead: int  # jobs of its kind started before it in the simulation (admitted this cycle, or queued)
    unknown: int  # of those, and of the running ones, how many have no known duration


def forecast(c: Ledger, kind: str, jobs: Iterable[WaitingJob], admitted_pools: Mapping[int, str],
             stop_at: int | None = None) -> dict[int, Start]:
    """The start of each job of `kind` in `jobs` (in admission order: the jobs admitted this cycle,
    whose pool `admitted_pools` gives, and the waiting jobs that can ever start), with every running
    job of `kind` in the snapshot. A job admitted this cycle starts at once, in its pool; it counts
    for the jobs after it in order only, as in the cycle that admitted it. Stops after `stop_at`."""
    s = c.s
    jobs = list(jobs)
    running = [r for r in s.running if r.gpu == kind]
    earliest = _starts(c, kind, jobs, admitted_pools, running, 1 - ETA_TOLERANCE, 0.0, stop_at)
    latest = _starts(c, kind, jobs, admitted_pools, running, 1 + ETA_TOLERANCE, s.eta_unknown_s, stop_at)
    unknown = sum(1 for r in running if r.remaining_s is None)
    out: dict[int, Start] = {}
    ahead = 0
    for j in jobs:
        if j.id not in earliest:
            break
        out[j.id] = Start(earliest[j.id], latest[j.id], len(running), ahead, unknown)
        if earliest[j.id] != INF:
            ahead += 1
            unknown += j.predicted_s is None
    return out


def _starts(c: Ledger, kind: str, jobs: list[WaitingJob], admitted_pools: Mapping[int, str],
            running: list[RunningJob], factor: float, unknown_s: float, stop_at: int | None) -> dict[int, float]:
    free = {n: p.gpus for n, p in c.pools.items() if p.gpu == kind}
    ends: dict[str, list[tuple[float, int]]] = {n: [] for n in free}
    team_use: dict[str, int] = {}
    team_ends: dict[str, list[tuple[float, int]]] = {}

    def occupy(pool: str | None, team: str, gpus: int, end: float) -> None:
        if pool in free:
            free[pool] -= gpus
            heapq.heappush(ends[pool], (end, gpus))
        team_use[team] = team_use.get(team, 0) + gpus
        heapq.heappush(team_ends.setdefault(team, []), (end, gpus))

    for r in running:
        occupy(r.pool, r.team, r.gpus, r.remaining_s * factor if r.remaining_s is not None else unknown_s)
    tiebreak = {n: [-ord(x) for x in n] for n in free}
    now = c.s.now
    pool_clock = dict.fromkeys(free, 0.0)
    team_clock: dict[str, float] = {}
    out: dict[int, float] = {}
    for j in jobs:
        admitted = admitted_pools.get(j.id)
        if admitted is not None:  # admitted this cycle: it holds its pool from now (ended ones free at the next look)
            occupy(admitted, j.team, j.gpus, j.predicted_s * factor if j.predicted_s is not None else unknown_s)
            out[j.id] = 0.0
            if j.id == stop_at:
                break
            continue
        names = c.fit(j)[0]
        cap = c.ever_limit(j.team, j.gpu)
        if not names or j.gpus > cap:
            out[j.id] = INF
        else:
            t = team_clock.get(j.team, 0.0)
            if j.not_before is not None and j.not_before - now > t:  # a retry: not before its backoff ends
                t = j.not_before - now
            for n in names:
                if pool_clock[n] > t:
                    t = pool_clock[n]
            th = team_ends.get(j.team, [])
            while True:
                for n in names:
                    h = ends[n]
                    while h and h[0][0] <= t:
                        free[n] += heapq.heappop(h)[1]
                while th and th[0][0] <= t:
                    team_use[j.team] -= heapq.heappop(th)[1]
                pool = names[0] if len(names) == 1 else max(names, key=lambda n: (free[n], tiebreak[n]))
                room = free[pool] >= j.gpus
                team_ok = team_use.get(j.team, 0) + j.gpus <= cap
                if room and team_ok:
                    break
                nxt = min((ends[n][0][0] for n in names if ends[n]), default=INF) if not room else INF
                if not team_ok and th and th[0][0] < nxt:
                    nxt = th[0][0]
                if nxt == INF:
                    break
                t = max(t, nxt)
            for n in names:  # nothing later that shares a pool or the team starts before it
                pool_clock[n] = t
            team_clock[j.team] = t
            if room and team_ok:
                out[j.id] = t
                occupy(pool, j.team, j.gpus, t + (j.predicted_s * factor if j.predicted_s is not None else unknown_s))
            else:
                out[j.id] = INF
        if j.id == stop_at:
            break
    return out


ADMITTED_NOW = "admitted in this cycle"


def forecast_kind(out: Outcome, kind: str, stop_at: int | None = None) -> dict[int, Start]:
    """`forecast` of the waiting jobs of `kind` in the walked order of `out` (those admitted in the
    cycle, and those blocked by nothing that says they can never start)."""
    admitted_pools = {a.job_id: a.pool for a in out.decision.admitted}
    blocked = out.blocked
    jobs = [a for a in out.order if a.gpu == kind and (
        a.id in admitted_pools or (a.id in blocked and not any(b.code in NEVER for b in blocked[a.id])))]
    return forecast(out.ledger, kind, jobs, admitted_pools, stop_at)


def eta_of(s: Snapshot, kind: str, blocked: list[Blocked] | None, start: Start | None) -> Eta:
    """The band of a job (`blocked`: why it waits, None when admitted this cycle) from its forecast
    (None: it can never start)."""
    if blocked is None:
        return Eta(earliest_s=0.0, latest_s=0.0, method=ADMITTED_NOW)
    if start is None:
        return Eta(earliest_s=None, latest_s=None, method="never, as things stand: it can never fit (see reasons)")
    if start.earliest == INF:
        return Eta(earliest_s=None, latest_s=None, method="no end in sight: nothing that runs frees enough room")
    method = (f"simulated {start.running} running and {start.ahead} queued {kind} jobs ahead in admission order:"
              f" durations x{1 - ETA_TOLERANCE:g}..x{1 + ETA_TOLERANCE:g}")
    if start.unknown:
        method += f"; {start.unknown} with unknown duration taken as 0..{s.eta_unknown_s:g} s"
    return Eta(earliest_s=round(start.earliest, 1), latest_s=None if start.latest == INF else round(start.latest, 1),
               method=method)


def band_of(out: Outcome, target: WaitingJob) -> Eta:
    """The band of `target`, the last job walked in `out`."""
    blocked = out.blocked.get(target.id)
    if blocked is None or any(b.code in NEVER for b in blocked):
        return eta_of(out.ledger.s, target.gpu, blocked, None)
    return eta_of(out.ledger.s, target.gpu, blocked, forecast_kind(out, target.gpu, stop_at=target.id).get(target.id))


__all__ = ["ADMITTED_NOW", "ETA_TOLERANCE", "Start", "band_of", "eta_of", "forecast", "forecast_kind"]
