"""The ledger of one admission cycle: capacity, what each team holds, quotas, lending and borrowing.

`Ledger(s)` reads a `Snapshot` once and keeps, as counters updated on each admission, reservation
and preemption: each pool's free GPUs (capacity minus every running job), what is reserved in it for
earlier jobs and what is being released by jobs under preemption or cancellation; each team's GPUs
per kind, its quota (`TeamLimits`) and what is reserved for it; per kind the lendable quota left
(every team's unused nominal up to its lending limit, plus capacity no nominal covers); and per
group its nominal and usage. The rest of the engine (placement, preemption, fair share, the
forecast, the queue view) reads it through the methods below and changes it only through `admit`,
`reserve`, `hold` and `release`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from service.scheduling.decisions import ReasonCode
from service.scheduling.model import Pool, PreemptionPolicy
from service.scheduling.reasons import Blocked
from service.scheduling.state import RunningJob, Snapshot, WaitingJob

INF = math.inf


@dataclass(frozen=True, slots=True)
class TeamLimits:
    """One team's quota of one GPU kind, as the engine counts it."""

    nominal: int
    borrow: float  # borrowing_limit, INF for none
    lend: int  # lending_limit capped at nominal

    def contrib(self, u: int) -> int:
        """What this team adds to its kind's free lendable quota at usage `u`: lent minus borrowed."""
        if u <= self.nominal:
            return min(self.lend, self.nominal - u)
        return self.nominal - u


NO_LIMITS = TeamLimits(0, 0, 0)
#: the pools a job shape may use: (big enough for it, those of them that may preempt, the largest
#: matching pool's size, whether any pool matches at all)
PoolFit = tuple[list[str], list[str], int, bool]


class Ledger:
    """Counters of one admission cycle (see the module's docstring). Keys: pools by name, teams and
    kinds as `(team, kind)`, groups as `(group, kind)`."""

    def __init__(self, s: Snapshot) -> None:
        self.s = s
        self.pools: dict[str, Pool] = {p.name: p for p in s.pools}
        self.free: dict[str, int] = {p.name: p.gpus for p in s.pools}
        self.reserved: dict[str, int] = dict.fromkeys(self.pools, 0)
        self.releasing: dict[str, int] = dict.fromkeys(self.pools, 0)
        self.running_by_pool: dict[str, list[RunningJob]] = {name: [] for name in self.pools}
        self.usage: dict[tuple[str, str], int] = {}
        self.team_res: dict[tuple[str, str], int] = {}
        self.team_releasing: dict[tuple[str, str], int] = {}
        self.limits: dict[tuple[str, str], TeamLimits] = {}
        self.free_lend: dict[str, int] = {}
        self.lend_res: dict[str, int] = {}
        self.lend_total: dict[str, int] = {}
        self.lend_releasing: dict[str, int] = {}
        self.start_borrow: dict[tuple[str, str], int] = {}  # each team's GPUs above nominal as the cycle began
        self.group_nominal: dict[tuple[str, str], int] = {}
        self.group_usage: dict[tuple[str, str], int] = {}
        self.start_group_borrow: dict[tuple[str, str], int] = {}
        self._pools_for: dict[tuple[str, str, str | None], list[str]] = {}
        self._fits: dict[tuple[str, str, str | None, int], PoolFit] = {}
        self._ever: dict[tuple[str, str], int] = {}
        cap: dict[str, int] = {}
        for p in s.pools:
            cap[p.gpu] = cap.get(p.gpu, 0) + p.gpus
        nominal_sum: dict[str, int] = {}
        lend_sum: dict[str, int] = {}
        quotas = dict(s.quotas)  # a team of a running or waiting job with none declared: the default
        if s.default_quota is not None:
            for team in {r.team for r in s.running} | {j.team for j in s.waiting}:
                quotas.setdefault(team, s.default_quota)
        for team, tq in quotas.items():
            for k, fq in tq.flavors.items():
                lend = fq.nominal if fq.lending_limit is None else min(fq.lending_limit, fq.nominal)
                borrow = INF if fq.borrowing_limit is None else float(fq.borrowing_limit)
                self.limits[(team, k)] = TeamLimits(fq.nominal, borrow, lend)
                nominal_sum[k] = nominal_sum.get(k, 0) + fq.nominal
                lend_sum[k] = lend_sum.get(k, 0) + lend
        kinds = set(cap) | {r.gpu for r in s.running} | {j.gpu for j in s.waiting}
        for k in kinds:
            self.lend_total[k] = max(0, cap.get(k, 0) - nominal_sum.get(k, 0)) + lend_sum.get(k, 0)
            self.free_lend[k] = self.lend_total[k]
            self.lend_res[k] = 0
            self.lend_releasing[k] = 0
        for r in s.running:
            key = (r.team, r.gpu)
            if r.pool in self.free:
                self.free[r.pool] -= r.gpus
                self.running_by_pool[r.pool].append(r)
            q = self.limits.get(key, NO_LIMITS)
            u = self.usage.get(key, 0)
            self.free_lend[r.gpu] += q.contrib(u + r.gpus) - q.contrib(u)
            self.usage[key] = u + r.gpus
            if not r.preemptible:
                if r.pool in self.releasing:
                    self.releasing[r.pool] += r.gpus
                self.team_releasing[key] = self.team_releasing.get(key, 0) + r.gpus
                self.lend_releasing[r.gpu] += r.gpus
        for key, u in self.usage.items():
            self.start_borrow[key] = max(0, u - self.limits.get(key, NO_LIMITS).nominal)
        for tq in s.quotas.values():
            if tq.group:
                for k, fq in tq.flavors.items():
                    gk = (tq.group, k)
                    self.group_nominal[gk] = self.group_nominal.get(gk, 0) + fq.nominal
        for (team, k), u in self.usage.items():
            group = self.group_of(team)
            if not group.startswith("team:"):
                gk = (group, k)
                self.group_usage[gk] = self.group_usage.get(gk, 0) + u
        for gk, u in self.group_usage.items():
            self.start_group_borrow[gk] = max(0, u - self.group_nominal.get(gk, 0))

    # -- reading ---------------------------------------------------------------------------------
    def limit(self, team: str, kind: str) -> TeamLimits:
        """The team's quota of `kind` (none declared for it: nominal 0, no borrowing)."""
        return self.limits.get((team, kind), NO_LIMITS)

    def group_of(self, team: str) -> str:
        """The team's quota group, or `team:<name>` for a team in none."""
        q = self.s.quotas.get(team)
        return q.group if q is not None and q.group else f"team:{team}"

    def room(self, pool: str) -> int:
        """The pool's free GPUs less what is reserved in it for earlier jobs."""
        return self.free[pool] - self.reserved[pool]

    def pools_for(self, backend: str, gpu: str, pin: str | None) -> list[str]:
        """The pools a job of this backend and GPU kind (pinned to pool `pin`, if any) may use, by name."""
        key = (backend, gpu, pin)
        found = self._pools_for.get(key)
        if found is None:
            found = self._pools_for[key] = sorted(
                p.name for p in self.pools.values()
                if p.backend == backend and p.gpu == gpu and (pin is None or p.name == pin))
        return found

    def fit(self, j: WaitingJob) -> PoolFit:
        """The pools `j` may use that are big enough for it (see `PoolFit`)."""
        key = (j.backend, j.gpu, j.pool, j.gpus)
        got = self._fits.get(key)
        if got is None:
            names = self.pools_for(j.backend, j.gpu, j.pool)
            big = [n for n in names if self.pools[n].gpus >= j.gpus]
            got = self._fits[key] = (big, [n for n in big if self.pools[n].preemption != PreemptionPolicy.NEVER],
                                     max((self.pools[n].gpus for n in names), default=0), bool(names))
        return got

    def ever_limit(self, team: str, kind: str) -> int:
        """The most GPUs of `kind` the team could hold with every other team idle."""
        key = (team, kind)
        got = self._ever.get(key)
        if got is None:
            q = self.limit(team, kind)
            others = self.lend_total.get(kind, 0) - q.lend
            got = self._ever[key] = q.nominal + int(min(q.borrow, max(0, others)))
        return got

    def within_nominal(self, team: str, kind: str, gpus: int) -> bool:
        """Whether the team stays within its nominal quota of `kind` with `gpus` more (and what is reserved for it)."""
        key = (team, kind)
        return self.usage.get(key, 0) + self.team_res.get(key, 0) + gpus <= self.limit(team, kind).nominal

    def within_group_nominal(self, team: str, kind: str, gpus: int) -> bool:
        """Whether the team's group (if any) stays within the group's nominal quota of `kind` with `gpus` more."""
        gk = (self.group_of(team), kind)
        return gk in self.group_nominal and self.group_usage.get(gk, 0) + gpus <= self.group_nominal[gk]

    def quota_block(self, j: WaitingJob, own_freed: int = 0, lend_extra: int = 0,
                    ignore_res: bool = False) -> Blocked | None:
        """None when the team's quota admits `j` now (after `own_freed` of its GPUs go, and with
        `lend_extra` more lendable; `ignore_res`: as if nothing were reserved), else why not."""
        key = (j.team, j.gpu)
        q = self.limits.get(key, NO_LIMITS)
        u = self.usage.get(key, 0) - own_freed + (0 if ignore_res else self.team_res.get(key, 0))
        g = j.gpus
        if u + g <= q.nominal:
            return None
        limit_total = q.nominal + q.borrow
        if u + g > limit_total:
            return Blocked(ReasonCode.QUOTA_EXCEEDED, int(max(0, limit_total - u)), int(limit_total),
                           "borrowing limit")
        base = self.free_lend[j.gpu] + lend_extra - (0 if ignore_res else self.lend_res[j.gpu])
        if base - q.contrib(u) + q.contrib(u + g) >= 0:
            return None
        room = max(0, q.nominal - u) + max(0, base - max(0, min(q.lend, q.nominal - u)))
        avail = int(min(room, max(0, limit_total - u)))
        return Blocked(ReasonCode.QUOTA_EXCEEDED, avail, int(min(limit_total, self.ever_limit(j.team, j.gpu))),
                       "lendable quota")

    def best_pool(self, names: list[str], g: int, extra: dict[str, int] | None = None,
                  ignore_res: bool = False) -> str | None:
        """The pool of `names` with room for `g` GPUs and the least room left (best fit), ties by
        name; None if none has room. `extra`: GPUs added to each pool's room; `ignore_res`: as if
        nothing were reserved."""
        best: tuple[int, str] | None = None
        for n in names:
            room = self.free[n] - (0 if ignore_res else self.reserved[n]) + (extra.get(n, 0) if extra else 0)
            if room >= g and (best is None or room < best[0]):
                best = (room, n)
        return best[1] if best else None

    def roomiest(self, names: list[str]) -> str:
        """The pool with the most unreserved free GPUs, ties by name (`names` is sorted); a pool
        holding more than its size (running jobs over a reduced capacity) counts as none free."""
        best, best_room = names[0], -1
        for n in names:
            room = self.room(n)
            if room > best_room:
                best, best_room = n, room
        return best

    def release_makes_room(self, j: WaitingJob, names: list[str]) -> bool:
        """Whether what is being released would make room for `j` in one of `names` (pools big enough
        for it), within its team's quota counting what its team and the kind release."""
        return any(self.releasing[n] for n in names) and self.best_pool(
            names, j.gpus, extra=self.releasing) is not None and self.quota_block(
            j, own_freed=self.team_releasing.get((j.team, j.gpu), 0),
            lend_extra=self.lend_releasing.get(j.gpu, 0)) is None

    def lend_gain(self, r: RunningJob) -> int:
        """How much lendable quota of its kind comes free when running job `r` goes."""
        q = self.limit(r.team, r.gpu)
        u = self.usage.get((r.team, r.gpu), 0)
        return q.contrib(u - r.gpus) - q.contrib(u)

    # -- changing --------------------------------------------------------------------------------
    def admit(self, j: WaitingJob, pool: str) -> int:
        """`j` takes its GPUs in `pool`; returns how many of them it borrows."""
        key = (j.team, j.gpu)
        q = self.limit(j.team, j.gpu)
        u = self.usage.get(key, 0)
        self.free[pool] -= j.gpus
        self.free_lend[j.gpu] += q.contrib(u + j.gpus) - q.contrib(u)
        self.usage[key] = u + j.gpus
        tq = self.s.quotas.get(j.team)
        if tq is not None and tq.group:
            gk = (tq.group, j.gpu)
            self.group_usage[gk] = self.group_usage.get(gk, 0) + j.gpus
        return max(0, u + j.gpus - q.nominal) - max(0, u - q.nominal)

    def reserve(self, j: WaitingJob, pool: str | None, quota_blocked: bool) -> None:
        """Hold what `j` waits for so that later jobs cannot take it (the no-starvation rule): the
        unreserved free GPUs of `pool` (its roomiest, when capacity blocks it) and, when quota blocks
        it, its team's remaining headroom and the lendable quota it needs."""
        g = j.gpus
        if pool is not None:
            self.hold(pool, g)
        if quota_blocked:
            key = (j.team, j.gpu)
            q = self.limit(j.team, j.gpu)
            u = self.usage.get(key, 0) + self.team_res.get(key, 0)
            if q.borrow != INF:
                take = int(min(g, max(0, q.nominal + q.borrow - u)))
                if take:
                    self.team_res[key] = self.team_res.get(key, 0) + take
            need_borrow = max(0, u + g - q.nominal) - max(0, u - q.nominal)
            take = min(need_borrow, max(0, self.free_lend[j.gpu] - self.lend_res[j.gpu]))
            if take:
                self.lend_res[j.gpu] += take

    def hold(self, pool: str, g: int) -> None:
        """Reserve up to `g` of the pool's unreserved free GPUs."""
        self.reserved[pool] += min(g, max(0, self.room(pool)))

    def release(self, pool: str, victim: RunningJob, for_team: str) -> None:
        """`victim` is being preempted in `pool` for a job of `for_team`: its GPUs count as being released."""
        self.releasing[pool] += victim.gpus
        if victim.team == for_team:
            key = (for_team, victim.gpu)
            self.team_releasing[key] = self.team_releasing.get(key, 0) + victim.gpus


__all__ = ["NO_LIMITS", "Ledger", "PoolFit", "TeamLimits"]
