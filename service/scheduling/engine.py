"""Admission, preemption, "why pending" and the ETA band: pure functions of a `Snapshot`.

Contract (docs/scheduling.md has the long form):

- `admit(s)` walks the waiting jobs once, in admission order, and admits each job whose GPUs fit
  in a matching pool's free GPUs (pool free minus what earlier jobs reserve) and in its team's quota
  for that GPU kind: its own `nominal`, plus up to `borrowing_limit` more taken from what others lend
  (every team's unused nominal up to its `lending_limit`, and pool capacity no team's nominal covers).
- Order: priority (desc); then jobs that stay inside their team's nominal before jobs that borrow;
  then the team's fair share (lowest first, recomputed after each of its admissions, as Kueue's
  heap does); then `submitted_at`, then id. A team's fair share:
  `max over GPU kinds k of cost_k * ((1 - blend) * borrowed_k / lendable_k + blend * past_k / past_total_k)
  / weight` (weight 0: last), where borrowed_k is its use above nominal, lendable_k the kind's total
  lendable quota, past_k its decayed past usage (`Snapshot.usage`) and past_total_k every team's.
- Backfill: a job that does not fit is skipped and later jobs may start, unless it has waited
  `reserve_after_s` (since submission, or since its backoff ended): then it reserves what it waits for
  (pool GPUs, its team's headroom, lendable quota) and later jobs may not take them; so every job
  that can ever fit is admitted once the jobs ahead of it in order have run.
- Preemption (per pool: never / reclaim / lower_priority): see `_Cycle.try_preempt`. A preempted job's
  GPUs are not free in this cycle; the preemptor reserves them, and in later cycles jobs being
  preempted or cancelled (`preemptible=False`) count as "being released", never as new victims.

Pure and deterministic: no clock, no database, no randomness; the same snapshot gives the same
`Decision`, `Explanation` and `Eta`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from operator import attrgetter

from service.planner.hardware import CATALOG
from service.scheduling.decisions import (
    Admission,
    Ahead,
    Decision,
    Eta,
    Explanation,
    Preemption,
    Reason,
    ReasonCode,
)
from service.scheduling.forecast import ETA_TOLERANCE, Start, forecast
from service.scheduling.model import Pool, PreemptionPolicy
from service.scheduling.state import RunningJob, Snapshot, WaitingJob

INF = math.inf
_A100_PEAK = CATALOG["A100-SXM-80GB"].peak_tflops["bf16"]


class UnknownJob(KeyError):
    """`explain`/`eta` for a job id that is neither waiting nor running in the snapshot."""


def kind_cost(kind: str, pools: Iterable[Pool] = ()) -> float:
    """Fair-share weight of one GPU of `kind`: the first pool's explicit `cost` (by name), else the
    catalog's bf16 (or best) peak relative to an A100's, else 1."""
    for p in sorted(pools, key=lambda p: p.name):
        if p.gpu == kind and p.cost is not None:
            return p.cost
    gpu = CATALOG.get(kind)
    if gpu is None or not gpu.peak_tflops:
        return 1.0
    peak = gpu.peak_tflops.get("bf16") or gpu.peak_tflops.get("fp16") or max(gpu.peak_tflops.values())
    return peak / _A100_PEAK


@dataclass(slots=True)
class _Quota:
    nominal: int
    borrow: float  # borrowing_limit, INF for none
    lend: int  # lending_limit capped at nominal

    def contrib(self, u: int) -> int:
        """What this team adds to its kind's free lendable quota at usage `u`: lent minus borrowed."""
        if u <= self.nominal:
            return min(self.lend, self.nominal - u)
        return self.nominal - u


_NO_QUOTA = _Quota(0, 0, 0)


@dataclass(slots=True)
class _Blocked:
    code: ReasonCode
    available: int
    limit: int
    detail: str = ""


@dataclass
class _Cycle:
    """Counters of one admission cycle, updated incrementally as jobs are admitted or reserve."""

    s: Snapshot
    pools: dict[str, Pool] = field(default_factory=dict)
    free: dict[str, int] = field(default_factory=dict)  # capacity minus every running job
    reserved: dict[str, int] = field(default_factory=dict)  # held for earlier (old or preempting) jobs
    releasing: dict[str, int] = field(default_factory=dict)  # held by jobs being preempted/cancelled
    usage: dict[tuple[str, str], int] = field(default_factory=dict)  # (team, kind) -> GPUs held
    team_res: dict[tuple[str, str], int] = field(default_factory=dict)
    team_releasing: dict[tuple[str, str], int] = field(default_factory=dict)
    free_lend: dict[str, int] = field(default_factory=dict)  # kind -> lendable minus borrowed
    lend_res: dict[str, int] = field(default_factory=dict)
    lend_total: dict[str, int] = field(default_factory=dict)
    lend_releasing: dict[str, int] = field(default_factory=dict)
    cost: dict[str, float] = field(default_factory=dict)
    past: dict[tuple[str, str], float] = field(default_factory=dict)  # share of the kind's past usage
    quotas: dict[tuple[str, str], _Quota] = field(default_factory=dict)
    candidates: dict[tuple[str, str, str | None], list[str]] = field(default_factory=dict)
    running_by_pool: dict[str, list[RunningJob]] = field(default_factory=dict)
    victims: set[int] = field(default_factory=set)
    start_borrow: dict[tuple[str, str], int] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)
    team_vals: dict[str, dict[str, float]] = field(default_factory=dict)
    past_kinds: dict[str, set[str]] = field(default_factory=dict)
    used_kinds: dict[str, set[str]] = field(default_factory=dict)  # team -> kinds with a `usage` entry
    ever: dict[tuple[str, str], int] = field(default_factory=dict)
    victim_lists: dict[str, list[tuple[RunningJob, str, int]]] = field(default_factory=dict)
    preempting: set[str] = field(default_factory=set)
    preempt_memo: dict[tuple[str, str, int, int], int] = field(default_factory=dict)
    place_memo: dict[tuple[object, ...], tuple[int, list[_Blocked]]] = field(default_factory=dict)
    big_enough: dict[tuple[str, str, str | None, int], tuple[list[str], list[str], int, bool]] = field(
        default_factory=dict)  # (backend, kind, pin, gpus) -> pools big enough, those that preempt, largest, any
    releasing_any: bool = False
    group_nominal: dict[tuple[str, str], int] = field(default_factory=dict)  # (group, kind)
    group_usage: dict[tuple[str, str], int] = field(default_factory=dict)
    start_group_borrow: dict[tuple[str, str], int] = field(default_factory=dict)
    has_lower: bool = False
    share_cache: dict[str, float] = field(default_factory=dict)
    reclaimable: dict[str, int] = field(default_factory=dict)
    own_lists: dict[str, dict[str, list[tuple[RunningJob, str, int]]]] = field(default_factory=dict)
    version: int = 0
    dry: set[tuple[str, str, str | None, int]] = field(default_factory=set)  # sizes with no room left
    quiet: set[tuple[str, str]] = field(default_factory=set)  # (team, kind) that can reserve no quota

    def __post_init__(self) -> None:
        s = self.s
        cap: dict[str, int] = {}
        for p in s.pools:
            self.pools[p.name] = p
            self.free[p.name] = p.gpus
            self.reserved[p.name] = 0
            self.releasing[p.name] = 0
            cap[p.gpu] = cap.get(p.gpu, 0) + p.gpus
            self.running_by_pool[p.name] = []
        kinds = set(cap)
        for r in s.running:
            kinds.add(r.gpu)
        kinds.update(map(_GPU, s.waiting))
        # past usage may name a kind nothing holds or wants now (a pool removed): its cost counts in
        # the team's fair share all the same
        for k in kinds.union(*s.usage.values()):
            self.cost[k] = kind_cost(k, s.pools)
        # quotas per (team, kind); unowned capacity lends to everyone
        nominal_sum: dict[str, int] = {}
        lend_sum: dict[str, int] = {}
        for team, tq in s.quotas.items():
            for k, fq in tq.flavors.items():
                lend = fq.nominal if fq.lending_limit is None else min(fq.lending_limit, fq.nominal)
                borrow = INF if fq.borrowing_limit is None else float(fq.borrowing_limit)
                self.quotas[(team, k)] = _Quota(fq.nominal, borrow, lend)
                nominal_sum[k] = nominal_sum.get(k, 0) + fq.nominal
                lend_sum[k] = lend_sum.get(k, 0) + lend
        default = s.default_quota
        if default is not None:
            teams = {r.team for r in s.running} | {j.team for j in s.waiting}
            for team in sorted(teams - set(s.quotas)):
                for k, fq in default.flavors.items():
                    lend = fq.nominal if fq.lending_limit is None else min(fq.lending_limit, fq.nominal)
                    borrow = INF if fq.borrowing_limit is None else float(fq.borrowing_limit)
                    self.quotas[(team, k)] = _Quota(fq.nominal, borrow, lend)
                    nominal_sum[k] = nominal_sum.get(k, 0) + fq.nominal
                    lend_sum[k] = lend_sum.get(k, 0) + lend
        for k in kinds:
            unowned = max(0, cap.get(k, 0) - nominal_sum.get(k, 0))
            self.lend_total[k] = unowned + lend_sum.get(k, 0)
            self.free_lend[k] = self.lend_total[k]
            self.lend_res[k] = 0
            self.lend_releasing[k] = 0
        for r in s.running:
            key = (r.team, r.gpu)
            if r.pool in self.free:
                self.free[r.pool] -= r.gpus
                self.running_by_pool[r.pool].append(r)
            q = self.quotas.get(key, _NO_QUOTA)
            u = self.usage.get(key, 0)
            self.free_lend[r.gpu] += q.contrib(u + r.gpus) - q.contrib(u)
            self.usage[key] = u + r.gpus
            if not r.preemptible:
                if r.pool in self.releasing:
                    self.releasing[r.pool] += r.gpus
                    self.releasing_any = True
                self.team_releasing[key] = self.team_releasing.get(key, 0) + r.gpus
                self.lend_releasing[r.gpu] += r.gpus
        for key, u in self.usage.items():
            q = self.quotas.get(key, _NO_QUOTA)
            self.start_borrow[key] = max(0, u - q.nominal)
            self.used_kinds.setdefault(key[0], set()).add(key[1])
        for tq in s.quotas.values():
            if tq.group:
                for k, fq in tq.flavors.items():
                    gk = (tq.group, k)
                    self.group_nominal[gk] = self.group_nominal.get(gk, 0) + fq.nominal
        for (team, k), u in self.usage.items():
            group = self._group(team)
            if not group.startswith("team:"):
                gk = (group, k)
                self.group_usage[gk] = self.group_usage.get(gk, 0) + u
        for gk, u in self.group_usage.items():
            self.start_group_borrow[gk] = max(0, u - self.group_nominal.get(gk, 0))
        totals: dict[str, float] = {}
        for team_usage in s.usage.values():
            for k, v in team_usage.items():
                totals[k] = totals.get(k, 0.0) + max(0.0, v)
        for team, team_usage in s.usage.items():
            for k, v in team_usage.items():
                if totals.get(k, 0.0) > 0:
                    self.past[(team, k)] = max(0.0, v) / totals[k]
                    self.past_kinds.setdefault(team, set()).add(k)
        self.has_lower = any(p.preemption == PreemptionPolicy.LOWER_PRIORITY for p in s.pools)

    # -- lookups ---------------------------------------------------------------------------------
    def quota(self, team: str, kind: str) -> _Quota:
        return self.quotas.get((team, kind), _NO_QUOTA)

    def pools_for(self, j: WaitingJob) -> list[str]:
        key = (j.backend, j.gpu, j.pool)
        found = self.candidates.get(key)
        if found is None:
            found = sorted(p.name for p in self.pools.values()
                           if p.backend == j.backend and p.gpu == j.gpu and (j.pool is None or p.name == j.pool))
            self.candidates[key] = found
        return found

    def weight(self, team: str) -> float:
        w = self.weights.get(team)
        if w is None:
            tq = self.s.quotas.get(team) or self.s.default_quota
            w = self.weights[team] = tq.weight if tq is not None else 1.0
        return w

    def _value(self, team: str, kind: str, u: int) -> float:
        borrowed = u - self.quota(team, kind).nominal
        total = self.lend_total.get(kind, 0)
        now_part = borrowed / total if borrowed > 0 and total > 0 else 0.0
        blend = self.s.usage_blend
        return self.cost[kind] * ((1 - blend) * now_part + blend * self.past.get((team, kind), 0.0))

    def share(self, team: str, kind: str, extra: int) -> float:
        """The team's fair share with `extra` more GPUs of `kind`: Kueue's dominant-resource share, each
        kind's value weighted by its cost and blended with past usage, over the team's weight."""
        w = self.weight(team)
        if w <= 0:
            return INF
        vals = self.team_vals.get(team)
        if vals is None:
            kinds = self.used_kinds.get(team, set()) | self.past_kinds.get(team, set())
            vals = self.team_vals[team] = {k: self._value(team, k, self.usage.get((team, k), 0)) for k in kinds}
        best = self._value(team, kind, self.usage.get((team, kind), 0) + extra)
        for k, v in vals.items():
            if v > best and k != kind:
                best = v
        return best / w

    def ever_limit(self, team: str, kind: str) -> int:
        """The most GPUs of `kind` the team could hold with every other team idle."""
        key = (team, kind)
        got = self.ever.get(key)
        if got is None:
            q = self.quota(team, kind)
            others = self.lend_total.get(kind, 0) - q.lend
            got = self.ever[key] = q.nominal + int(min(q.borrow, max(0, others)))
        return got

    # -- fit checks ------------------------------------------------------------------------------
    def quota_block(self, j: WaitingJob, own_freed: int = 0, lend_extra: int = 0,
                    ignore_res: bool = False) -> _Blocked | None:
        """None when the team's quota admits `j` now (after `own_freed` of its GPUs go, and with
        `lend_extra` more lendable), else why not."""
        key = (j.team, j.gpu)
        q = self.quotas.get(key, _NO_QUOTA)
        u = self.usage.get(key, 0) - own_freed + (0 if ignore_res else self.team_res.get(key, 0))
        g = j.gpus
        if u + g <= q.nominal:
            return None
        limit_total = q.nominal + q.borrow
        if u + g > limit_total:
            return _Blocked(ReasonCode.QUOTA_EXCEEDED, int(max(0, limit_total - u)), int(limit_total),
                            "borrowing limit")
        base = self.free_lend[j.gpu] + lend_extra - (0 if ignore_res else self.lend_res[j.gpu])
        if base - q.contrib(u) + q.contrib(u + g) >= 0:
            return None
        room = max(0, q.nominal - u) + max(0, base - max(0, min(q.lend, q.nominal - u)))
        avail = int(min(room, max(0, limit_total - u)))
        return _Blocked(ReasonCode.QUOTA_EXCEEDED, avail, int(min(limit_total, self.ever_limit(j.team, j.gpu))),
                        "lendable quota")

    def best_pool(self, names: list[str], g: int, extra: dict[str, int] | None = None,
                  ignore_res: bool = False) -> str | None:
        """The fitting pool with the least room left (best fit), ties by name; None if none fits."""
        best: tuple[int, str] | None = None
        for n in names:
            room = self.free[n] - (0 if ignore_res else self.reserved[n]) + (extra.get(n, 0) if extra else 0)
            if room >= g and (best is None or room < best[0]):
                best = (room, n)
        return best[1] if best else None

    def roomiest(self, names: list[str]) -> str:
        """The pool with the most unreserved free GPUs, ties by name (`names` is sorted)."""
        best, best_room = names[0], self.free[names[0]] - self.reserved[names[0]]
        for n in names[1:]:
            room = self.free[n] - self.reserved[n]
            if room > best_room:
                best, best_room = n, room
        return best

    def admit(self, j: WaitingJob, pool: str) -> int:
        key = (j.team, j.gpu)
        q = self.quota(j.team, j.gpu)
        u = self.usage.get(key, 0)
        self.free[pool] -= j.gpus
        self.free_lend[j.gpu] += q.contrib(u + j.gpus) - q.contrib(u)
        self.usage[key] = u + j.gpus
        self.used_kinds.setdefault(j.team, set()).add(j.gpu)
        tq = self.s.quotas.get(j.team)
        if tq is not None and tq.group:
            gk = (tq.group, j.gpu)
            self.group_usage[gk] = self.group_usage.get(gk, 0) + j.gpus
        vals = self.team_vals.get(j.team)
        if vals is not None:
            vals[j.gpu] = self._value(j.team, j.gpu, u + j.gpus)
        self.share_cache.pop(j.team, None)
        self.version += 1
        return max(0, u + j.gpus - q.nominal) - max(0, u - q.nominal)

    def reserve(self, j: WaitingJob, pool: str | None, quota_blocked: bool) -> None:
        """Hold what `j` waits for so that later jobs cannot take it (the no-starvation rule): the
        unreserved free GPUs of `pool` (its roomiest, when capacity blocks it) and, when quota blocks
        it, its team's remaining headroom and the lendable quota it needs."""
        g = j.gpus
        if pool is not None:
            take = min(g, max(0, self.free[pool] - self.reserved[pool]))
            if take:
                self.reserved[pool] += take
                self.version += 1
        if quota_blocked:
            key = (j.team, j.gpu)
            q = self.quota(j.team, j.gpu)
            u = self.usage.get(key, 0) + self.team_res.get(key, 0)
            if q.borrow != INF:
                take = int(min(g, max(0, q.nominal + q.borrow - u)))
                if take:
                    self.team_res[key] = self.team_res.get(key, 0) + take
                    self.version += 1
            need_borrow = max(0, u + g - q.nominal) - max(0, u - q.nominal)
            take = min(need_borrow, max(0, self.free_lend[j.gpu] - self.lend_res[j.gpu]))
            if take:
                self.lend_res[j.gpu] += take
                self.version += 1

    # -- preemption ------------------------------------------------------------------------------
    def _group(self, team: str) -> str:
        q = self.s.quotas.get(team)
        return q.group if q is not None and q.group else f"team:{team}"

    def _candidates(self, pool: str) -> list[tuple[RunningJob, str, int]]:
        """The pool's running jobs that may ever be preempted this cycle (preemptible, at least
        `min_runtime_s` old), in victim order: least work lost since the last checkpoint, biggest
        borrower (its team's GPUs above nominal at the start of the cycle), lowest priority, newest id.
        Each with its group and its team's borrowed GPUs."""
        got = self.victim_lists.get(pool)
        if got is None:
            now, min_rt = self.s.now, self.s.min_runtime_s
            rows = []
            for r in self.running_by_pool[pool]:
                begun = r.started_at if r.started_at is not None else r.admitted_at
                if not r.preemptible or now - begun < min_rt:
                    continue
                lost = 0.0 if r.started_at is None else max(0.0, now - max(r.started_at, r.checkpoint_at or 0.0))
                borrow = self.start_borrow.get((r.team, r.gpu), 0)
                rows.append(((lost, -borrow, r.priority, -r.id), r, self._group(r.team), borrow))
            rows.sort(key=lambda row: row[0])
            got = self.victim_lists[pool] = [(r, g, b) for _, r, g, b in rows]
        return got

    def try_preempt(self, j: WaitingJob, names: list[str]) -> tuple[str, list[RunningJob], str] | None:
        """Victims that make `j` fit in one of `names`, or None (then nothing is preempted).

        Rules: a team that stays within its nominal quota with `j` reclaims from jobs of teams that
        borrow this GPU kind (pools with policy reclaim or lower_priority); a team whose group stays
        within the group's nominal quota reclaims from borrowing teams of other groups that hold
        more than their group's nominal (or ungrouped borrowers): unused quota is lent inside a group
        first; in lower_priority pools a job also preempts its own team's lower-priority jobs. Never
        a job younger than `min_runtime_s`, one already being preempted or cancelled, or one chosen
        for another job; at
        most one job preempts per pool per cycle (victims are chosen against a settled state).
        Order: borrowers outside the preemptor's group first (lending stays inside the group first),
        then least work lost since the last checkpoint, biggest borrower, lowest priority, newest id.
        Greedy until `j` fits in capacity and quota, then every victim not needed is dropped."""
        q = self.quota(j.team, j.gpu)
        u = self.usage.get((j.team, j.gpu), 0)
        within_nominal = u + self.team_res.get((j.team, j.gpu), 0) + j.gpus <= q.nominal
        group = self._group(j.team)
        gk = (group, j.gpu)
        within_group = not within_nominal and gk in self.group_nominal and (
            self.group_usage.get(gk, 0) + j.gpus <= self.group_nominal[gk])
        reclaims = within_nominal or within_group
        if not reclaims and not any(self.pools[n].preemption == PreemptionPolicy.LOWER_PRIORITY for n in names):
            return None
        # the pools that may preempt for it, roomiest first (ties by name)
        open_pools = [n for n in names if n not in self.preempting and (
            self.pools[n].preemption == PreemptionPolicy.LOWER_PRIORITY
            or (reclaims and self.pools[n].preemption != PreemptionPolicy.NEVER))]
        if len(open_pools) > 1:
            open_pools.sort(key=lambda n: (-(self.free[n] - self.reserved[n]), n))
        for name in open_pools:
            lower = self.pools[name].preemption == PreemptionPolicy.LOWER_PRIORITY
            if not self._may_free_enough(j, name, lower, reclaims):
                continue
            memo = (name, j.team, j.gpus, j.priority if lower else 0)
            if self.preempt_memo.get(memo) == self.version:
                continue
            got = self._victims_in(j, name, lower, within_nominal, within_group, group)
            if got is None:
                self.preempt_memo[memo] = self.version
                continue
            victims, rules = got
            teams = sorted({v.team for v in victims})
            if rules == {"priority"}:
                why = (f"priority: job {j.id} (priority {j.priority}) of team {j.team} preempts lower-priority"
                       f" jobs of its own team in pool {name}")
            elif within_nominal:
                why = (f"reclaim: team {j.team} takes back its nominal {j.gpu} quota ({q.nominal}) from"
                       f" borrowing team(s) {', '.join(t for t in teams if t != j.team)} in pool {name}")
            else:
                why = (f"reclaim: team {j.team} of group {group} takes back the group's {j.gpu} quota"
                       f" ({self.group_nominal[gk]}) lent outside it, from team(s)"
                       f" {', '.join(t for t in teams if t != j.team)} in pool {name}")
            self.preempting.add(name)
            self.reclaimable.pop(name, None)
            self.version += 1
            return name, victims, why
        return None

    def _may_free_enough(self, j: WaitingJob, name: str, lower: bool, within_nominal: bool) -> bool:
        """A cheap upper bound: could every eligible victim in the pool together make room for `j`?"""
        bound = self.free[name] - self.reserved[name] + self.releasing[name]
        if within_nominal:
            bound += self.reclaimable.get(name, 0) if name in self.reclaimable else self._reclaimable(name)
        if lower:
            for r, _, _ in self._own_candidates(name, j.team):
                if r.priority >= j.priority:
                    break
                if r.id not in self.victims:
                    bound += r.gpus
        return bound >= j.gpus

    def _reclaimable(self, name: str) -> int:
        total = sum(r.gpus for r, _, borrow in self._candidates(name) if borrow > 0 and r.id not in self.victims)
        self.reclaimable[name] = total
        return total

    def _own_candidates(self, name: str, team: str) -> list[tuple[RunningJob, str, int]]:
        """The team's preemptible jobs in the pool, lowest priority first."""
        by_team = self.own_lists.get(name)
        if by_team is None:
            by_team = self.own_lists[name] = {}
            for row in self._candidates(name):
                by_team.setdefault(row[0].team, []).append(row)
            for rows in by_team.values():
                rows.sort(key=lambda row: row[0].priority)
        return by_team.get(team, [])

    def _victims_in(self, j: WaitingJob, name: str, lower: bool, within_nominal: bool, within_group: bool,
                    group: str) -> tuple[list[RunningJob], set[str]] | None:
        room = self.free[name] - self.reserved[name] + self.releasing[name]
        own_release = self.team_releasing.get((j.team, j.gpu), 0)
        lend_release = self.lend_releasing.get(j.gpu, 0)
        eligible: list[tuple[RunningJob, str]] = []
        for outside_pass in (True, False):
            for r, g, borrow in self._candidates(name):
                if r.id in self.victims or (g != group) != outside_pass:
                    continue
                if r.team == j.team:
                    if lower and r.priority < j.priority:
                        eligible.append((r, "priority"))
                elif borrow > 0 and (within_nominal or (
                        within_group and g != group and (
                            g.startswith("team:") or self.start_group_borrow.get((g, r.gpu), 0) > 0))):
                    eligible.append((r, "reclaim"))
        if not eligible:
            return None
        if room + sum(r.gpus for r, _ in eligible) < j.gpus:
            return None
        chosen: list[tuple[RunningJob, str]] = []
        borrow_left: dict[str, int] = {}
        freed = own = 0
        lend_extra = lend_release
        fits = False
        for r, rule in eligible:
            if rule == "reclaim":
                left = borrow_left.get(r.team, self.start_borrow.get((r.team, r.gpu), 0))
                if left <= 0:
                    continue
                borrow_left[r.team] = left - r.gpus
            chosen.append((r, rule))
            freed += r.gpus
            if r.team == j.team:
                own += r.gpus
            else:
                lend_extra += self._lend_gain(r)
            if room + freed >= j.gpus and (within_nominal or self.quota_block(
                    j, own_freed=own + own_release, lend_extra=lend_extra) is None):
                fits = True
                break
        if not fits:
            return None
        for i in range(len(chosen) - 1, -1, -1):
            r = chosen[i][0]
            mine = r.team == j.team
            f2, o2 = freed - r.gpus, own - (r.gpus if mine else 0)
            l2 = lend_extra - (0 if mine else self._lend_gain(r))
            if room + f2 >= j.gpus and (within_nominal or self.quota_block(
                    j, own_freed=o2 + own_release, lend_extra=l2) is None):
                chosen.pop(i)
                freed, own, lend_extra = f2, o2, l2
        if not chosen:  # what is already being released makes room: nothing to preempt, `j` waits for it
            return None
        return [r for r, _ in chosen], {rule for _, rule in chosen}

    def _lend_gain(self, r: RunningJob) -> int:
        q = self.quota(r.team, r.gpu)
        u = self.usage.get((r.team, r.gpu), 0)
        return q.contrib(u - r.gpus) - q.contrib(u)


@dataclass
class _Outcome:
    decision: Decision
    order: list[WaitingJob]
    blocked: dict[int, list[_Blocked]]
    cycle: _Cycle


def _job_key(j: WaitingJob) -> tuple[int, float, int]:
    return (-j.priority, j.submitted_at, j.id)


#: in a lean run (no reasons), how many placements between two checks of whether the cycle has settled
SETTLE_CHECK_EVERY = 64
#: `blocked` entry of a job a lean run skipped: it waits, for reasons not derived (for a job of the
#: explained target's kind never backoff, no matching pool or a size beyond its team's limit: those
#: are always derived)
_NOT_DERIVED: list[_Blocked] = []


def _run(s: Snapshot, want_reasons: bool = True, stop_at: int | None = None, settle: bool = False) -> _Outcome:
    """Walk the waiting jobs in admission order and place each (`_place`).

    The full run (`want_reasons=True`) places every job and derives every waiting job's reasons.
    A lean run (`want_reasons=False`) gives the same admissions, preemptions, order and state, but
    skips jobs that are provably inert (`_inert`: placing them would change nothing); their
    `blocked` entry is `_NOT_DERIVED`. `stop_at` ends the walk after that job (never skipped);
    in a lean run with `stop_at`, once the cycle has settled (`_SettleState`), jobs of other GPU
    kinds than the target's are skipped too (`_NOT_DERIVED`): they can no longer be admitted or
    preempt, and what they reserve is quota and pools of their own kind, which neither the
    target's reasons nor its ETA (same-kind jobs only) read.
    `settle=True` (lean) also ends the walk as soon as no remaining job can be admitted or preempt
    (`_settled`): `order` is then only the prefix walked."""
    c = _Cycle(s)
    now = s.now
    lean = not want_reasons
    by_team: dict[str, list[WaitingJob]] = {}
    for j in s.waiting:
        got = by_team.get(j.team)
        if got is None:
            by_team[j.team] = [j]
        else:
            got.append(j)
    heads: list[tuple[int, int, float, float, int, str, int]] = []
    queues: dict[str, list[WaitingJob]] = {}
    presorted = s.waiting_in_order
    for team, jobs in by_team.items():
        if not presorted:  # the order of _job_key: (-priority, submitted_at, id), as two stable sorts keyed in C
            jobs.sort(key=_SUB_ID)
            jobs.sort(key=_PRIO, reverse=True)
        queues[team] = jobs
        heads.append(_head_key(c, team, jobs[0], 0))
    heapq.heapify(heads)
    admitted: list[Admission] = []
    preempted: list[Preemption] = []
    order: list[WaitingJob] = []
    blocked: dict[int, list[_Blocked]] = {}
    reserve_after = s.reserve_after_s
    stop = False
    next_check = SETTLE_CHECK_EVERY
    settle_state: _SettleState | None = None
    # explain/eta: once settled, a job of another GPU kind than the target's changes nothing the
    # answer reads (it only reserves quota of its own kind, in pools of its own kind)
    target_kind = next((j.gpu for j in s.waiting if j.id == stop_at), None) if lean else None
    settled = False
    while heads and not stop:
        if (settle or target_kind is not None) and not settled and len(order) >= next_check:
            next_check = len(order) + SETTLE_CHECK_EVERY
            if settle_state is None:
                settle_state = _SettleState(c, queues)
            settled = settle_state.settled(heads)
            if settled and settle:
                break
        *_, team, idx = heapq.heappop(heads)
        jobs = queues[team]
        # A team's jobs come out as a run while its next key stays ahead of every other team's head.
        while True:
            j = jobs[idx]
            order.append(j)
            if lean and j.id != stop_at and ((settled and j.gpu != target_kind) or _inert(c, j, now)):
                blocked[j.id] = _NOT_DERIVED
            else:
                why = _place(c, j, now, reserve_after, admitted, preempted)
                if why:
                    blocked[j.id] = why
            if stop_at is not None and j.id == stop_at:
                stop = True
                break
            idx += 1
            if idx >= len(jobs):
                break
            nxt = _head_key(c, team, jobs[idx], idx)
            if heads and nxt > heads[0]:
                heapq.heappush(heads, nxt)
                break
    waiting: dict[int, list[Reason]] = {}
    if want_reasons:
        cache: dict[tuple[object, ...], Reason] = {}
        for j in order:
            bl = blocked.get(j.id)
            if bl is not None:
                waiting[j.id] = [_reason(c, j, b, cache) for b in bl]
    decision = Decision.model_construct(admitted=admitted, preempted=preempted, waiting=waiting,
                                        order=[j.id for j in order])
    return _Outcome(decision, order, blocked, c)


_SUB_ID = attrgetter("submitted_at", "id")
_PRIO = attrgetter("priority")
_GPUS = attrgetter("gpus")
_GPU = attrgetter("gpu")


def _inert(c: _Cycle, j: WaitingJob, now: float) -> bool:
    """True only when `_place(c, j)` would provably change nothing: no admission, no preemption, no
    reservation (so `c.version` stays). Each condition only ever gets truer within a cycle (free and
    unreserved room, quota headroom and lendable quota only shrink; a pool preempts at most once),
    so a job found inert is inert later in the cycle too. False says nothing (then `_place` decides).

    - every pool big enough for it has no unreserved room (no admission, no pool to reserve);
    - it reserves no quota: its team's quota admits it, or the team has no finite borrowing
      headroom left and the kind no lendable quota left;
    - it may preempt in none of its pools: each is preempting already, or the necessary conditions
      of `_Cycle.try_preempt` fail (it neither reclaims nor is in a lower_priority pool, or every
      eligible victim together would not make room: `_may_free_enough`)."""
    if j.not_before is not None and j.not_before > now:
        return False  # `_place` answers backoff at once
    size_key = (j.backend, j.gpu, j.pool, j.gpus)
    fit = c.big_enough.get(size_key)
    if fit is None:
        return False
    big, preemptible, _, _ = fit
    if not big or j.gpus > c.ever_limit(j.team, j.gpu):
        return False  # `_place` answers no_matching_pool or exceeds_team_limit at once
    if size_key not in c.dry:
        free, reserved = c.free, c.reserved
        for n in big:
            if free[n] - reserved[n] > 0:
                return False
        c.dry.add(size_key)
    key = (j.team, j.gpu)
    if key not in c.quiet:
        q = c.quotas.get(key, _NO_QUOTA)
        if (q.borrow != INF and q.nominal + q.borrow - c.usage.get(key, 0) - c.team_res.get(key, 0) > 0) or (
                c.free_lend.get(j.gpu, 0) - c.lend_res.get(j.gpu, 0) > 0):
            if c.quota_block(j) is not None:
                return False  # quota blocks it, and there is quota it may reserve
        else:
            c.quiet.add(key)
    if preemptible:
        reclaims: bool | None = None
        for n in preemptible:
            if n in c.preempting:
                continue
            if reclaims is None:
                q = c.quotas.get(key, _NO_QUOTA)
                gk = (c._group(j.team), j.gpu)
                reclaims = c.usage.get(key, 0) + c.team_res.get(key, 0) + j.gpus <= q.nominal or (
                    gk in c.group_nominal and c.group_usage.get(gk, 0) + j.gpus <= c.group_nominal[gk])
            lower = c.pools[n].preemption == PreemptionPolicy.LOWER_PRIORITY
            if (reclaims or lower) and c._may_free_enough(j, n, lower, reclaims):
                # it might preempt, unless `_place` waits for what is being released instead
                return c.releasing_any and any(c.releasing[m] for m in big) and c.best_pool(
                    big, j.gpus, extra=c.releasing) is not None and c.quota_block(
                    j, own_freed=c.team_releasing.get(key, 0), lend_extra=c.lend_releasing.get(j.gpu, 0)) is None
    return True


class _SettleState:
    """Whether a cycle has settled: no remaining job can be admitted or preempt (then nothing
    remaining can change `admitted` or `preempted`; reservations may, but only what later jobs see).

    Per pool, conservatively (every test only ever gets truer within a cycle, so a pool found dead
    stays dead): its unreserved room is below the smallest waiting job's size, and it may not
    preempt (policy never, preempting already, or no team with jobs of its kind left can: within
    its nominal or its group's with the smallest size, or, in a lower_priority pool, with a
    lower-priority job of its own there, and even then only if every eligible victim together,
    with the room, covers the smallest size)."""

    def __init__(self, c: _Cycle, queues: dict[str, list[WaitingJob]]) -> None:
        self.c = c
        self.queues = queues
        self.gmin = min((min(map(_GPUS, jobs)) for jobs in queues.values()), default=1)
        self.last_of_kind: dict[str, dict[str, int]] = {}  # team -> kind -> index of its last job of it
        for team, jobs in queues.items():
            last = self.last_of_kind[team] = {}
            for kind in set(map(_GPU, jobs)):
                i = len(jobs) - 1
                while jobs[i].gpu != kind:
                    i -= 1
                last[kind] = i
        self.closed: set[str] = {p.name for p in c.pools.values() if p.preemption == PreemptionPolicy.NEVER}
        self.safe: set[tuple[str, str]] = set()  # (team, reclaim pool): none of its jobs left preempts there
        self.resume: dict[tuple[str, str], int] = {}  # (team, reclaim pool): first job not found safe

    def _waits_for_release(self, team: str, idx: int, name: str) -> bool:
        """Whether no job of `team` left (from `idx`) can preempt in reclaim pool `name`, now or later
        in the cycle: none fits in its group's nominal headroom, and each either does not fit in its
        team's nominal headroom (so it never reclaims), or does while no pool it fits has unreserved
        room and one is releasing enough for it, so `_place` waits for that release instead (its
        quota holds with what its team releases: it stays within nominal). Stays true: room and
        both headrooms only shrink, releases only grow (a job that drops out of its nominal
        headroom does not reclaim then, as it fits in no group headroom)."""
        c = self.c
        now = c.s.now
        free, reserved, releasing = c.free, c.reserved, c.releasing
        kind = c.pools[name].gpu
        size = c.pools[name].gpus
        key = (team, kind)
        q = c.quotas.get(key, _NO_QUOTA)
        used = c.usage.get(key, 0) + c.team_res.get(key, 0)
        gk = (c._group(team), kind)
        group_left = c.group_nominal[gk] - c.group_usage.get(gk, 0) if gk in c.group_nominal else -1
        jobs = self.queues[team]
        for i in range(max(idx, self.resume.get((team, name), idx)), len(jobs)):
            j = jobs[i]
            g = j.gpus
            if j.gpu != kind or g > size or (j.not_before is not None and j.not_before > now):
                continue
            names = c.pools_for(j)
            if name not in names:
                continue
            if g <= group_left:
                self.resume[(team, name)] = i
                return False  # it may reclaim for its group, now or once its team's headroom is gone
            if used + g > q.nominal:
                continue  # it does not reclaim, now or later
            big = [n for n in names if c.pools[n].gpus >= g]
            if any(free[n] - reserved[n] for n in big) or not any(releasing[n] >= g for n in big):
                self.resume[(team, name)] = i  # the jobs before it stay safe: start here next time
                return False
        return True

    def settled(self, heads: list[tuple[int, int, float, float, int, str, int]]) -> bool:
        """Whether every pool is dead; `heads` holds every team with jobs left (team, next index)."""
        c, gmin = self.c, self.gmin
        for name, p in c.pools.items():
            if c.free[name] - c.reserved[name] >= gmin and any(
                    self.last_of_kind[head[5]].get(p.gpu, -1) >= head[6] for head in heads):
                return False  # room for the smallest size, and jobs of its kind left
        for name, p in c.pools.items():
            if name in self.closed or name in c.preempting:
                continue
            room = c.free[name] - c.reserved[name]
            lower = p.preemption == PreemptionPolicy.LOWER_PRIORITY
            for head in heads:
                team, idx = head[5], head[6]
                if self.last_of_kind[team].get(p.gpu, -1) < idx:
                    continue  # no job of this kind left
                key = (team, p.gpu)
                q = c.quotas.get(key, _NO_QUOTA)
                gk = (c._group(team), p.gpu)
                reclaims = c.usage.get(key, 0) + c.team_res.get(key, 0) + gmin <= q.nominal or (
                    gk in c.group_nominal and c.group_usage.get(gk, 0) + gmin <= c.group_nominal[gk])
                if not reclaims and not lower:
                    continue
                if reclaims and not lower and (team, name) in self.safe:
                    continue
                if reclaims and not lower and self._waits_for_release(team, idx, name):
                    self.safe.add((team, name))
                    continue
                bound = room + c.releasing[name]
                if reclaims:
                    bound += c.reclaimable[name] if name in c.reclaimable else c._reclaimable(name)
                if lower:
                    top = self.queues[team][idx].priority  # the highest priority it has left
                    for r, _, _ in c._own_candidates(name, team):
                        if r.priority >= top:
                            break
                        if r.id not in c.victims:
                            bound += r.gpus
                if bound >= gmin:
                    return False
            self.closed.add(name)
        return True


def _head_key(c: _Cycle, team: str, j: WaitingJob, idx: int) -> tuple[int, int, float, float, int, str, int]:
    """Admission order: priority (desc), staying within nominal before borrowing, the team's fair share
    (lowest first), submission time, id."""
    key = (team, j.gpu)
    borrows = 1 if c.usage.get(key, 0) + j.gpus > c.quotas.get(key, _NO_QUOTA).nominal else 0
    share = c.share_cache.get(team)
    if share is None:
        share = c.share_cache[team] = c.share(team, j.gpu, 0)
    return (-j.priority, borrows, share, j.submitted_at, j.id, team, idx)


def _place(c: _Cycle, j: WaitingJob, now: float, reserve_after: float,
           admitted: list[Admission], preempted: list[Preemption]) -> list[_Blocked] | None:
    """Admit `j`, or preempt for it, or say why it waits (and reserve for it when it has waited long).

    A job blocked in a state (`c.version`) that nothing has changed since an identical job (team,
    kind, backend, pin, size, wait class, and priority where it matters) was blocked is blocked for
    the same reasons: the answer is reused, which keeps a saturated cycle linear and cheap."""
    if j.not_before is not None and j.not_before > now:
        return [_Blocked(ReasonCode.BACKOFF, 0, 0, f"{j.not_before - now:.0f}")]
    long_wait = now - max(j.submitted_at, j.not_before or j.submitted_at) >= reserve_after
    memo_key = (j.team, j.gpu, j.backend, j.pool, j.gpus, long_wait, j.priority if c.has_lower else 0)
    hit = c.place_memo.get(memo_key)
    if hit is not None and hit[0] == c.version:
        return hit[1]
    size_key = (j.backend, j.gpu, j.pool, j.gpus)
    fit = c.big_enough.get(size_key)
    if fit is None:
        names = c.pools_for(j)
        big = [n for n in names if c.pools[n].gpus >= j.gpus]
        largest = max((c.pools[n].gpus for n in names), default=0)
        fit = c.big_enough[size_key] = (big, [n for n in big if c.pools[n].preemption != PreemptionPolicy.NEVER],
                                         largest, bool(names))
    big_enough, preemptible_pools, largest, any_pool = fit
    if not big_enough:
        return [_Blocked(ReasonCode.NO_MATCHING_POOL, largest, largest, "too small" if any_pool else "none")]
    ever = c.ever.get((j.team, j.gpu))
    if ever is None:
        ever = c.ever_limit(j.team, j.gpu)
    if j.gpus > ever:
        return [_Blocked(ReasonCode.EXCEEDS_TEAM_LIMIT, ever, ever)]
    qb = c.quota_block(j)
    # one pass over the pools: best fit, the roomiest, and whether one fits but for reservations
    g = j.gpus
    free, reserved = c.free, c.reserved
    pool: str | None = None
    best_room = roomiest_room = -1
    roomiest = big_enough[0]
    fits_unreserved = False
    for n in big_enough:
        room = free[n] - reserved[n]
        if room >= g:
            if pool is None or room < best_room:
                pool, best_room = n, room
        elif free[n] >= g:
            fits_unreserved = True
        if room > roomiest_room:
            roomiest, roomiest_room = n, room
    if qb is None and pool is not None:
        admitted.append(Admission.model_construct(job_id=j.id, pool=pool, borrowed=c.admit(j, pool)))
        return None
    version = c.version
    # Blocked: say why, then wait for what is being released, or preempt, or reserve.
    why: list[_Blocked] = []
    if qb is not None:
        if (c.lend_res[j.gpu] or c.team_res.get((j.team, j.gpu))) and c.quota_block(j, ignore_res=True) is None:
            why.append(_Blocked(ReasonCode.WAITING_FOR_PRIORITY, qb.available, qb.limit, "quota held"))
        else:
            why.append(qb)
    cap_blocked = pool is None
    if cap_blocked:
        room = max(0, roomiest_room)
        if fits_unreserved:
            why.append(_Blocked(ReasonCode.WAITING_FOR_PRIORITY, room, c.pools[roomiest].gpus,
                                f"pool held:{roomiest}"))
        else:
            why.append(_Blocked(ReasonCode.WAITING_FOR_CAPACITY, room, c.pools[roomiest].gpus,
                                f"pool:{roomiest}" + (";quota" if qb else "")))
    releasing = c.releasing_any and any(c.releasing[n] for n in big_enough) and c.best_pool(
        big_enough, j.gpus, extra=c.releasing) is not None and c.quota_block(
        j, own_freed=c.team_releasing.get((j.team, j.gpu), 0), lend_extra=c.lend_releasing.get(j.gpu, 0)) is None
    if releasing:
        for b in why:
            b.detail += ";releasing"
        c.reserve(j, c.roomiest(big_enough), qb is not None)
        return why
    got = None
    if preemptible_pools and any(n not in c.preempting for n in preemptible_pools):
        got = c.try_preempt(j, big_enough)
    if got is not None:
        name, victims, reason = got
        for v in victims:
            c.victims.add(v.id)
            preempted.append(Preemption.model_construct(victim=v.id, by=j.id, reason=reason))
            c.releasing[name] += v.gpus
            c.releasing_any = True
            if v.team == j.team:
                c.team_releasing[(j.team, j.gpu)] = c.team_releasing.get((j.team, j.gpu), 0) + v.gpus
        c.reserved[name] += min(j.gpus, max(0, c.free[name] - c.reserved[name]))
        for b in why:
            b.detail += ";preempting"
        return why
    if long_wait and ((cap_blocked and roomiest_room > 0) or qb is not None):
        c.reserve(j, roomiest if cap_blocked and roomiest_room > 0 else None, qb is not None)
    if c.version == version:
        c.place_memo[memo_key] = (version, why)
    return why


def _reason(c: _Cycle, j: WaitingJob, b: _Blocked, cache: dict[tuple[object, ...], Reason]) -> Reason:
    key = (b.code, j.team, j.gpu, j.gpus, b.available, b.limit, b.detail, j.backend, j.pool)  # all the message names
    got = cache.get(key)
    if got is not None:
        return got
    flavor = j.gpu
    code = b.code
    tail = ""
    if b.detail.endswith(";releasing"):
        tail = "; GPUs being released by preempted or cancelled jobs will make room"
    elif b.detail.endswith(";preempting"):
        tail = "; jobs are being preempted to make room for it"
    if code is ReasonCode.BACKOFF:
        msg = f"a retry waiting out its backoff: admitted no sooner than in {b.detail.split(';')[0]} s"
        r = Reason.model_construct(code=code, message=msg, flavor=None, requested=None, available=None, limit=None)
    elif code is ReasonCode.NO_MATCHING_POOL:
        if b.detail == "none":
            msg = (f"no pool has backend {j.backend} and GPU kind {j.gpu}"
                   + (f" named {j.pool}" if j.pool else ""))
        else:
            msg = f"needs {j.gpus} {j.gpu} GPUs in one pool; the largest matching pool has {b.limit}"
        r = Reason.model_construct(code=code, message=msg, flavor=flavor, requested=j.gpus,
                                   available=b.available, limit=b.limit)
    else:
        if code is ReasonCode.EXCEEDS_TEAM_LIMIT:
            msg = (f"team {j.team} may never hold more than {b.limit} {flavor} GPUs (nominal plus what it may"
                   f" borrow); the job needs {j.gpus}")
        elif code is ReasonCode.QUOTA_EXCEEDED:
            msg = (f"team {j.team}'s {flavor} quota is in use: {b.available} of the {j.gpus} GPUs it needs are"
                   f" available to it now ({b.detail}; at most {b.limit})")
        elif code is ReasonCode.WAITING_FOR_CAPACITY:
            pool = b.detail.split(";")[0].removeprefix("pool:")
            msg = (f"pool {pool} has {b.available} of {b.limit} {flavor} GPUs free; it needs {j.gpus}"
                   + ("" if ";quota" in b.detail else " (its team's quota allows it)"))
        else:
            held = "quota" if b.detail.startswith("quota held") else "GPUs"
            msg = (f"it would fit, but the {held} it needs are held for higher-priority or longer-waiting jobs"
                   f" ahead of it ({b.available} {flavor} GPUs free to it, needs {j.gpus})")
        r = Reason.model_construct(code=code, message=msg + tail, flavor=flavor, requested=j.gpus,
                                   available=b.available, limit=b.limit)
    cache[key] = r
    return r


def admit(s: Snapshot, *, reasons: bool = True) -> Decision:
    """One admission cycle: which waiting jobs start where, which running jobs to preempt, why the rest wait.

    `reasons=False` (the dispatcher's call) gives exactly the same `admitted` and `preempted`, in
    the same order, faster: `waiting` is empty, and `order` is only the prefix of the full order
    that was walked before the cycle provably settled (no remaining job could be admitted or
    preempt). Use the default for `waiting` and the whole `order`."""
    if reasons:
        return _run(s).decision
    return _run(s, want_reasons=False, settle=True).decision


def _competes(c: _Cycle, a: WaitingJob, b: WaitingJob, cache: dict[tuple[str, str, str | None], bool]) -> bool:
    """Whether `a` could take a pool `b` may use (same GPU kind, a pool in common)."""
    if a.gpu != b.gpu:
        return False
    key = (a.backend, a.gpu, a.pool)
    got = cache.get(key)
    if got is None:
        got = cache[key] = bool(set(c.pools_for(a)) & set(c.pools_for(b)))
    return got


def explain(s: Snapshot, job_id: int, viewer_team: str | None) -> Explanation:
    """Why job `job_id` waits: reasons with numbers, its position in its team and pool (1-based), the
    jobs ahead of it that compete for the same pools (the viewer's own team's listed, other teams'
    only counted and summed; `viewer_team=None` is an admin and sees every one), and the ETA band.
    Raises `UnknownJob` when the job is neither waiting nor running. `queue_view` gives every waiting
    job's explanation from one cycle, equal to this one's."""
    for r in s.running:
        if r.id == job_id:
            return Explanation(status="admitted", admitted=True,
                               eta=Eta(earliest_s=0.0, latest_s=0.0, method="already admitted"))
    target = next((j for j in s.waiting if j.id == job_id), None)
    if target is None:
        raise UnknownJob(f"job {job_id} is neither waiting nor admitted in this snapshot")
    out = _run(s, want_reasons=False, stop_at=job_id)
    c = out.cycle
    blocked = out.blocked.get(job_id)
    ahead = out.order[:-1]
    team_pos = 1 + sum(1 for a in ahead if a.team == target.team)
    overlap: dict[tuple[str, str, str | None], bool] = {}
    competing = [a for a in ahead if _competes(c, a, target, overlap)]
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
        cache: dict[tuple[object, ...], Reason] = {}
        waiting_ahead = [a for a in competing if a.id in out.blocked]
        reasons = with_priority_reason(target, [_reason(c, target, b, cache) for b in blocked],
                                       len(waiting_ahead), sum(a.gpus for a in waiting_ahead))
    return Explanation(
        status="queued", admitted=blocked is None, reasons=reasons,
        position={"team": team_pos, "pool": len(competing) + 1},
        ahead=listed, ahead_other_teams={"jobs": others_jobs, "gpus": others_gpus} if others_jobs else {},
        ahead_scope="every_team" if viewer_team is None else "team", eta=_eta_from(s, out, target))


def with_priority_reason(target: WaitingJob, reasons: list[Reason], waiting_jobs: int,
                         waiting_gpus: int) -> list[Reason]:
    """`reasons`, plus `waiting_for_priority` when the job waits for capacity while `waiting_jobs`
    other waiting jobs (`waiting_gpus` GPUs) for the same pools are ahead of it and no reason says so yet."""
    codes = {r.code for r in reasons}
    if waiting_jobs and ReasonCode.WAITING_FOR_PRIORITY not in codes and ReasonCode.WAITING_FOR_CAPACITY in codes:
        reasons = [*reasons, Reason(
            code=ReasonCode.WAITING_FOR_PRIORITY, flavor=target.gpu, requested=target.gpus,
            message=f"{waiting_jobs} waiting jobs ({waiting_gpus} {target.gpu} GPUs) for the same pools are ahead"
            " of it in admission order")]
    return reasons


def eta(s: Snapshot, job_id: int) -> Eta:
    """Earliest/latest seconds from `s.now` until `job_id` starts: see `service.scheduling.forecast`."""
    for r in s.running:
        if r.id == job_id:
            return Eta(earliest_s=0.0, latest_s=0.0, method="already admitted")
    target = next((j for j in s.waiting if j.id == job_id), None)
    if target is None:
        raise UnknownJob(f"job {job_id} is neither waiting nor admitted in this snapshot")
    return _eta_from(s, _run(s, want_reasons=False, stop_at=job_id), target)


#: reasons that mean a job cannot start, as things stand (it takes no part in the forecast)
NEVER = frozenset({ReasonCode.NO_MATCHING_POOL, ReasonCode.EXCEEDS_TEAM_LIMIT})
ADMITTED_NOW = "admitted in this cycle"


def forecast_kind(out: _Outcome, kind: str, stop_at: int | None = None) -> dict[int, Start]:
    """`forecast.forecast` of the waiting jobs of `kind` in the walked order of `out`."""
    admitted_pools = {a.job_id: a.pool for a in out.decision.admitted}
    blocked = out.blocked
    jobs = [a for a in out.order if a.gpu == kind and (
        a.id in admitted_pools or (a.id in blocked and not any(b.code in NEVER for b in blocked[a.id])))]
    return forecast(out.cycle, kind, jobs, admitted_pools, stop_at)


def eta_of(s: Snapshot, kind: str, blocked: list[_Blocked] | None, start: Start | None) -> Eta:
    """The band of a job (`blocked`: why it waits, None when admitted this cycle) from its forecast."""
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


def _eta_from(s: Snapshot, out: _Outcome, target: WaitingJob) -> Eta:
    blocked = out.blocked.get(target.id)
    if blocked is None or any(b.code in NEVER for b in blocked):
        return eta_of(s, target.gpu, blocked, None)
    return eta_of(s, target.gpu, blocked, forecast_kind(out, target.gpu, stop_at=target.id).get(target.id))


__all__ = ["ETA_TOLERANCE", "UnknownJob", "admit", "eta", "explain", "kind_cost"]
