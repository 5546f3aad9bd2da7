"""The queue view: every waiting job's explanation from one full cycle, so "why pending" is a lookup.

`queue_view(s)` walks the whole queue once (`cycle.run`, as `engine.admit` does), counts positions
and jobs ahead per pool set as it goes, and forecasts each GPU kind's queue once
(`service.scheduling.forecast`), instead of one walk and one simulation per job asked about. Each
`QueueEntry` holds the job's explanation as its own team sees it, less the `ahead` list (which
depends on who asks); `from_view` adds it from the entries ahead of the job.

Contract: for every waiting job `j` of `s` and a viewer that is its team or an admin (None),
`from_view(entry_j, competitors ahead, viewer) == engine.explain(s, j, viewer)` (tested over random
snapshots). The dispatcher writes the view after each cycle (`service.store.queue_view`); the API
answers from it while it is fresh and falls back to `engine.explain` otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from service.scheduling.cycle import run
from service.scheduling.decisions import Ahead, Eta, Explanation, Reason
from service.scheduling.forecast import Start, eta_of, forecast_kind
from service.scheduling.reasons import NEVER, ReasonCache, reason_of, with_priority_reason
from service.scheduling.state import Snapshot


class Competitor(Protocol):
    """What `from_view` reads of a job ahead (a `QueueEntry`, or a row of the stored view)."""

    @property
    def job_id(self) -> int: ...
    @property
    def team(self) -> str: ...
    @property
    def gpu(self) -> str: ...
    @property
    def gpus(self) -> int: ...
    @property
    def priority(self) -> int: ...
    @property
    def order(self) -> int: ...
    @property
    def pools(self) -> Sequence[str]: ...


@dataclass(frozen=True, slots=True)
class QueueEntry:
    """One waiting job of the view: where it stands and why, as its own team sees it (`from_view`
    makes the `Explanation`)."""

    job_id: int
    team: str
    gpu: str
    gpus: int
    priority: int
    order: int  # 0-based place in the whole admission order
    pools: tuple[str, ...]  # the pools it may use: two jobs of a kind compete when they share one
    admitted: bool  # admitted in this cycle
    reasons: tuple[Reason, ...]
    team_position: int
    pool_position: int
    others_jobs: int  # competing jobs ahead of it from other teams, and their GPUs
    others_gpus: int
    eta: Eta

    def competes_with(self, other: QueueEntry) -> bool:
        """Whether `other` could take a pool this job may use (same GPU kind, a pool in common)."""
        return self.gpu == other.gpu and not set(self.pools).isdisjoint(other.pools)


def queue_view(s: Snapshot) -> list[QueueEntry]:
    """Every waiting job of `s`, in admission order, with its explanation (see the module's contract)."""
    out = run(s, reasons=False)
    ledger = out.ledger
    order = out.order
    blocked = out.blocked
    # jobs compete when they share a pool: group them by what decides their pools (backend, kind, pin)
    keys = {(j.backend, j.gpu, j.pool) for j in order}
    names = {k: frozenset(ledger.pools_for(*k)) for k in keys}
    pool_names = {k: tuple(sorted(v)) for k, v in names.items()}
    rivals = {k: [o for o in keys if o[1] == k[1] and names[k] & names[o]] for k in keys}
    starts: dict[int, Start] = {}
    for kind in sorted({j.gpu for j in order}):
        starts.update(forecast_kind(out, kind))
    seen_team: dict[str, int] = {}
    jobs_k: dict[tuple[str, str, str | None], int] = dict.fromkeys(keys, 0)
    gpus_k = dict.fromkeys(keys, 0)
    wait_jobs_k = dict.fromkeys(keys, 0)
    wait_gpus_k = dict.fromkeys(keys, 0)
    own_jobs: dict[tuple[str, tuple[str, str, str | None]], int] = {}
    own_gpus: dict[tuple[str, tuple[str, str, str | None]], int] = {}
    cache: ReasonCache = {}
    entries: list[QueueEntry] = []
    for index, j in enumerate(order):
        key = (j.backend, j.gpu, j.pool)
        competing = gpus_sum = waiting = waiting_gpus = mine = mine_gpus = 0
        for o in rivals[key]:
            competing += jobs_k[o]
            gpus_sum += gpus_k[o]
            waiting += wait_jobs_k[o]
            waiting_gpus += wait_gpus_k[o]
            mine += own_jobs.get((j.team, o), 0)
            mine_gpus += own_gpus.get((j.team, o), 0)
        why = blocked.get(j.id)
        reasons: list[Reason] = []
        if why:
            reasons = with_priority_reason(j, [reason_of(j, b, cache) for b in why], waiting, waiting_gpus)
        never = why is not None and any(b.code in NEVER for b in why)
        entries.append(QueueEntry(
            job_id=j.id, team=j.team, gpu=j.gpu, gpus=j.gpus, priority=j.priority, order=index,
            pools=pool_names[key], admitted=why is None, reasons=tuple(reasons),
            team_position=seen_team.get(j.team, 0) + 1, pool_position=competing + 1,
            others_jobs=competing - mine, others_gpus=gpus_sum - mine_gpus,
            eta=eta_of(s, j.gpu, why, None if never else starts.get(j.id))))
        seen_team[j.team] = seen_team.get(j.team, 0) + 1
        jobs_k[key] += 1
        gpus_k[key] += j.gpus
        if why is not None:
            wait_jobs_k[key] += 1
            wait_gpus_k[key] += j.gpus
        own_jobs[(j.team, key)] = own_jobs.get((j.team, key), 0) + 1
        own_gpus[(j.team, key)] = own_gpus.get((j.team, key), 0) + j.gpus
    return entries


def from_view(entry: QueueEntry, ahead: Iterable[Competitor], viewer_team: str | None) -> Explanation:
    """The explanation of `entry` for `viewer_team` (None: an admin, who sees every job ahead; else
    the job's own team). `ahead`: entries ahead of it, at least every competing one of the viewer's
    team (every competing one for an admin); others are ignored."""
    mine = set(entry.pools)
    listed = [Ahead(job_id=a.job_id, team=a.team, gpus=a.gpus, priority=a.priority)
              for a in sorted(ahead, key=lambda a: a.order)
              if a.order < entry.order and a.gpu == entry.gpu and not mine.isdisjoint(a.pools)
              and (viewer_team is None or a.team == viewer_team)]
    others = ({"jobs": entry.others_jobs, "gpus": entry.others_gpus}
              if viewer_team is not None and entry.others_jobs else {})
    return Explanation(status="queued", admitted=entry.admitted, reasons=list(entry.reasons),
                       position={"team": entry.team_position, "pool": entry.pool_position}, ahead=listed,
                       ahead_other_teams=others, ahead_scope="every_team" if viewer_team is None else "team",
                       eta=entry.eta)


__all__ = ["Competitor", "QueueEntry", "from_view", "queue_view"]
