"""Admission order and fair share.

Order: priority (desc); then jobs that stay inside their team's nominal before jobs that borrow;
then the team's fair share (lowest first, recomputed after each of its admissions, as Kueue's heap
does); then `submitted_at`, then id (`order_key`). A team's fair share:
`max over GPU kinds k of cost_k * ((1 - blend) * borrowed_k / lendable_k + blend * past_k / past_total_k)
/ weight` (weight 0: last), where borrowed_k is its use above nominal, lendable_k the kind's total
lendable quota, past_k its decayed past usage (`Snapshot.usage`) and past_total_k every team's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from service.planner.hardware import CATALOG
from service.scheduling.ledger import Ledger
from service.scheduling.model import Pool
from service.scheduling.state import WaitingJob

INF = math.inf
_A100_PEAK = CATALOG["A100-SXM-80GB"].peak_tflops["bf16"]
#: a waiting job's place in admission order, ending with its team and its index in the team's queue
OrderKey = tuple[int, int, float, float, int, str, int]


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


class FairShare:
    """Each team's fair share over one cycle, from the ledger's usage; `admitted` after each admission
    of a team updates that team's (every other team's stays)."""

    def __init__(self, ledger: Ledger) -> None:
        s = ledger.s
        self.ledger = ledger
        kinds = set(ledger.lend_total)
        # past usage may name a kind nothing holds or wants now (a pool removed): its cost counts in
        # the team's fair share all the same
        self.cost = {k: kind_cost(k, s.pools) for k in kinds.union(*s.usage.values())}
        self.weights: dict[str, float] = {}
        self.past: dict[tuple[str, str], float] = {}  # the team's share of the kind's past usage
        self.kinds: dict[str, set[str]] = {}  # team -> kinds it holds or held
        for team, kind in ledger.usage:
            self.kinds.setdefault(team, set()).add(kind)
        totals: dict[str, float] = {}
        for team_usage in s.usage.values():
            for k, v in team_usage.items():
                totals[k] = totals.get(k, 0.0) + max(0.0, v)
        for team, team_usage in s.usage.items():
            for k, v in team_usage.items():
                if totals.get(k, 0.0) > 0:
                    self.past[(team, k)] = max(0.0, v) / totals[k]
                    self.kinds.setdefault(team, set()).add(k)
        self._values: dict[str, dict[str, float]] = {}  # team -> kind -> value at its current usage
        self._shares: dict[str, float] = {}

    def weight(self, team: str) -> float:
        w = self.weights.get(team)
        if w is None:
            tq = self.ledger.s.quotas.get(team) or self.ledger.s.default_quota
            w = self.weights[team] = tq.weight if tq is not None else 1.0
        return w

    def _value(self, team: str, kind: str, u: int) -> float:
        borrowed = u - self.ledger.limit(team, kind).nominal
        total = self.ledger.lend_total.get(kind, 0)
        now_part = borrowed / total if borrowed > 0 and total > 0 else 0.0
        blend = self.ledger.s.usage_blend
        return self.cost[kind] * ((1 - blend) * now_part + blend * self.past.get((team, kind), 0.0))

    def share(self, team: str, kind: str, extra: int = 0) -> float:
        """The team's fair share with `extra` more GPUs of `kind`: Kueue's dominant-resource share, each
        kind's value weighted by its cost and blended with past usage, over the team's weight."""
        w = self.weight(team)
        if w <= 0:
            return INF
        usage = self.ledger.usage
        vals = self._values.get(team)
        if vals is None:
            vals = self._values[team] = {k: self._value(team, k, usage.get((team, k), 0))
                                         for k in self.kinds.get(team, ())}
        best = self._value(team, kind, usage.get((team, kind), 0) + extra)
        for k, v in vals.items():
            if v > best and k != kind:
                best = v
        return best / w

    def admitted(self, team: str, kind: str) -> None:
        """The team was admitted GPUs of `kind` (the ledger counts them already)."""
        self.kinds.setdefault(team, set()).add(kind)
        vals = self._values.get(team)
        if vals is not None:
            vals[kind] = self._value(team, kind, self.ledger.usage[(team, kind)])
        self._shares.pop(team, None)

    def order_key(self, team: str, j: WaitingJob, idx: int) -> OrderKey:
        """Admission order of `j`, the team's job at `idx` (see the module's docstring); the team's
        share is taken once per admission of the team."""
        key = (team, j.gpu)
        borrows = 1 if self.ledger.usage.get(key, 0) + j.gpus > self.ledger.limit(team, j.gpu).nominal else 0
        share = self._shares.get(team)
        if share is None:
            share = self._shares[team] = self.share(team, j.gpu)
        return (-j.priority, borrows, share, j.submitted_at, j.id, team, idx)


__all__ = ["FairShare", "OrderKey", "kind_cost"]
