"""Preemption: which running jobs make room for a waiting one, by the pools' policies.

Per pool (never / reclaim / lower_priority): a team that stays within its nominal quota with the
waiting job reclaims from jobs of teams that borrow this GPU kind (pools with policy reclaim or
lower_priority); a team whose group stays within the group's nominal quota reclaims from borrowing
teams of other groups that hold more than their group's nominal (or ungrouped borrowers): unused
quota is lent inside a group first; in lower_priority pools a job also preempts its own team's
lower-priority jobs. Never a job younger than `min_runtime_s`, one already being preempted or
cancelled, or one chosen for another job; at most one job preempts per pool per cycle (victims are
chosen against a settled state).
"""

from __future__ import annotations

from service.scheduling.ledger import Ledger
from service.scheduling.model import PreemptionPolicy
from service.scheduling.state import RunningJob, WaitingJob

#: a candidate victim: the running job, its team's group, its team's GPUs above nominal
Candidate = tuple[RunningJob, str, int]


class Preemptor:
    """The victims chosen in one cycle, over the ledger's counters."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.victims: set[int] = set()
        self.preempting: set[str] = set()  # pools where a job preempts this cycle
        self._candidates: dict[str, list[Candidate]] = {}
        self._own: dict[str, dict[str, list[Candidate]]] = {}

    def candidates(self, pool: str) -> list[Candidate]:
        """The pool's running jobs that may ever be preempted this cycle (preemptible, at least
        `min_runtime_s` old), in victim order: least work lost since the last checkpoint, biggest
        borrower (its team's GPUs above nominal at the start of the cycle), lowest priority, newest id."""
        got = self._candidates.get(pool)
        if got is None:
            led = self.ledger
            now, min_rt = led.s.now, led.s.min_runtime_s
            rows = []
            for r in led.running_by_pool[pool]:
                begun = r.started_at if r.started_at is not None else r.admitted_at
                if not r.preemptible or now - begun < min_rt:
                    continue
                lost = 0.0 if r.started_at is None else max(0.0, now - max(r.started_at, r.checkpoint_at or 0.0))
                borrow = led.start_borrow.get((r.team, r.gpu), 0)
                rows.append(((lost, -borrow, r.priority, -r.id), r, led.group_of(r.team), borrow))
            rows.sort(key=lambda row: row[0])
            got = self._candidates[pool] = [(r, g, b) for _, r, g, b in rows]
        return got

    def own_candidates(self, pool: str, team: str) -> list[Candidate]:
        """The team's candidates in the pool, lowest priority first."""
        by_team = self._own.get(pool)
        if by_team is None:
            by_team = self._own[pool] = {}
            for row in self.candidates(pool):
                by_team.setdefault(row[0].team, []).append(row)
            for rows in by_team.values():
                rows.sort(key=lambda row: row[0].priority)
        return by_team.get(team, [])

    def reclaimable(self, pool: str) -> int:
        """GPUs of borrowing teams' candidates in the pool not chosen yet."""
        return sum(r.gpus for r, _, borrow in self.candidates(pool) if borrow > 0 and r.id not in self.victims)

    def may_free_enough(self, gpus: int, team: str, priority: int, name: str, lower: bool, reclaims: bool) -> bool:
        """An upper bound: could every eligible victim in pool `name` together, with its room and
        what it is releasing, make room for `gpus` GPUs of `team` at `priority`?"""
        bound = self.ledger.room(name) + self.ledger.releasing[name]
        if reclaims:
            bound += self.reclaimable(name)
        if lower:
            for r, _, _ in self.own_candidates(name, team):
                if r.priority >= priority:
                    break
                if r.id not in self.victims:
                    bound += r.gpus
        return bound >= gpus

    def try_preempt(self, j: WaitingJob, names: list[str]) -> tuple[list[RunningJob], str] | None:
        """Victims that make `j` fit in one of `names` (with the reason), or None:
        then nothing is preempted. Order: borrowers outside the preemptor's group first (lending stays
        inside the group first), then least work lost since the last checkpoint, biggest borrower,
        lowest priority, newest id. Greedy until `j` fits in capacity and quota, then every victim not
        needed is dropped. The chosen pool preempts no more this cycle."""
        led = self.ledger
        within_nominal = led.within_nominal(j.team, j.gpu, j.gpus)
        within_group = not within_nominal and led.within_group_nominal(j.team, j.gpu, j.gpus)
        reclaims = within_nominal or within_group
        group = led.group_of(j.team)
        # the pools that may preempt for it, roomiest first (ties by name)
        open_pools = [n for n in names if n not in self.preempting and (
            led.pools[n].preemption == PreemptionPolicy.LOWER_PRIORITY
            or (reclaims and led.pools[n].preemption != PreemptionPolicy.NEVER))]
        if len(open_pools) > 1:
            open_pools.sort(key=lambda n: (-led.room(n), n))
        for name in open_pools:
            lower = led.pools[name].preemption == PreemptionPolicy.LOWER_PRIORITY
            got = self._victims_in(j, name, lower, within_nominal, within_group, group)
            if got is None:
                continue
            victims, rules = got
            teams = ", ".join(t for t in sorted({v.team for v in victims}) if t != j.team)
            if rules == {"priority"}:
                why = (f"priority: job {j.id} (priority {j.priority}) of team {j.team} preempts lower-priority"
                       f" jobs of its own team in pool {name}")
            elif within_nominal:
                why = (f"reclaim: team {j.team} takes back its nominal {j.gpu} quota"
                       f" ({led.limit(j.team, j.gpu).nominal}) from borrowing team(s) {teams} in pool {name}")
            else:
                why = (f"reclaim: team {j.team} of group {group} takes back the group's {j.gpu} quota"
                       f" ({led.group_nominal[(group, j.gpu)]}) lent outside it, from team(s) {teams} in pool {name}")
            self.preempting.add(name)
            self.victims.update(v.id for v in victims)
            for v in victims:
                led.release(name, v, j.team)
            led.hold(name, j.gpus)
            return victims, why
        return None

    def _victims_in(self, j: WaitingJob, name: str, lower: bool, within_nominal: bool, within_group: bool,
                    group: str) -> tuple[list[RunningJob], set[str]] | None:
        led = self.ledger
        room = led.room(name) + led.releasing[name]
        own_release = led.team_releasing.get((j.team, j.gpu), 0)
        lend_release = led.lend_releasing.get(j.gpu, 0)
        eligible: list[tuple[RunningJob, str]] = []
        for outside_pass in (True, False):
            for r, g, borrow in self.candidates(name):
                if r.id in self.victims or (g != group) != outside_pass:
                    continue
                if r.team == j.team:
                    if lower and r.priority < j.priority:
                        eligible.append((r, "priority"))
                elif borrow > 0 and (within_nominal or (
                        within_group and g != group and (
                            g.startswith("team:") or led.start_group_borrow.get((g, r.gpu), 0) > 0))):
                    eligible.append((r, "reclaim"))
        if not eligible or room + sum(r.gpus for r, _ in eligible) < j.gpus:
            return None
        chosen: list[tuple[RunningJob, str]] = []
        borrow_left: dict[str, int] = {}
        freed = own = 0
        lend_extra = lend_release
        fits = False
        for r, rule in eligible:
            if rule == "reclaim":
                left = borrow_left.get(r.team, led.start_borrow.get((r.team, r.gpu), 0))
                if left <= 0:
                    continue
                borrow_left[r.team] = left - r.gpus
            chosen.append((r, rule))
            freed += r.gpus
            if r.team == j.team:
                own += r.gpus
            else:
                lend_extra += led.lend_gain(r)
            if room + freed >= j.gpus and (within_nominal or led.quota_block(
                    j, own_freed=own + own_release, lend_extra=lend_extra) is None):
                fits = True
                break
        if not fits:
            return None
        for i in range(len(chosen) - 1, -1, -1):
            r = chosen[i][0]
            mine = r.team == j.team
            f2, o2 = freed - r.gpus, own - (r.gpus if mine else 0)
            l2 = lend_extra - (0 if mine else led.lend_gain(r))
            if room + f2 >= j.gpus and (within_nominal or led.quota_block(
                    j, own_freed=o2 + own_release, lend_extra=l2) is None):
                chosen.pop(i)
                freed, own, lend_extra = f2, o2, l2
        if not chosen:  # what is already being released makes room: nothing to preempt, `j` waits for it
            return None
        return [r for r, _ in chosen], {rule for _, rule in chosen}


__all__ = ["Candidate", "Preemptor"]
