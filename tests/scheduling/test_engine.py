"""The admission engine: order, quotas and borrowing, preemption, why-pending and the ETA band."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings

from service.scheduling.decisions import Decision, ReasonCode
from service.scheduling.engine import UnknownJob, admit, eta, explain
from service.scheduling.fair_share import kind_cost
from service.scheduling.model import FlavorQuota, PreemptionPolicy, TeamQuota
from service.scheduling.state import Snapshot
from tests.scheduling.builders import GPU, NOW, pool, quota, run, snap, wait
from tests.support.snapshot_strategies import snapshots


def admitted_ids(d: Decision) -> list[int]:
    return [a.job_id for a in d.admitted]


def codes(d: Decision, job_id: int) -> set[ReasonCode]:
    return {r.code for r in d.waiting[job_id]}


# -- order -----------------------------------------------------------------------------------------

def test_a_team_under_its_nominal_quota_is_admitted_before_a_borrower() -> None:
    # b holds 6 of 8 (2 borrowed from a's unused nominal); 2 GPUs free; b asked first, a is within nominal.
    s = snap([pool(gpus=8)], {"a": quota(4), "b": quota(4)},
             running=[run(10, "b", 6)],
             waiting=[wait(1, "b", 2, submitted=NOW - 500), wait(2, "a", 2, submitted=NOW - 10)])
    d = admit(s)
    assert d.order == [2, 1]
    assert admitted_ids(d) == [2]
    assert d.admitted[0].borrowed == 0
    assert codes(d, 1) & {ReasonCode.QUOTA_EXCEEDED, ReasonCode.WAITING_FOR_CAPACITY}


def test_priority_comes_first_then_fair_share_then_submission_then_id() -> None:
    # a (weight 1) and b (weight 2) each borrow 4 of a 10-GPU pool: b's share is half of a's.
    s = snap([pool(gpus=12)], {"a": quota(0), "b": quota(0, weight=2), "z": quota(0, weight=0)},
             running=[run(10, "a", 4), run(11, "b", 4)],
             waiting=[wait(1, "a", 1, submitted=NOW - 100), wait(2, "b", 1, submitted=NOW - 50),
                      wait(3, "a", 1, priority=5, submitted=NOW - 1), wait(5, "b", 1, submitted=NOW - 50),
                      wait(4, "b", 1, submitted=NOW - 50), wait(6, "z", 1, submitted=NOW - 1000)])
    d = admit(s)
    # priority 5 first; then b (lower share), its jobs by submission then id; a; weight 0 last
    assert d.order[:4] == [3, 2, 4, 5]
    assert d.order[-1] == 6
    assert admitted_ids(d) == [3, 2, 4, 5]  # 4 GPUs free


def test_the_same_snapshot_gives_the_same_decision_whatever_the_input_order() -> None:
    rng = random.Random(7)
    waiting = [wait(i, rng.choice("abc"), rng.choice([1, 2, 4]), submitted=NOW - rng.choice([10, 20, 30]))
               for i in range(1, 40)]
    running = [run(100 + i, "abc"[i % 3], 1, checkpoint=NOW - 60 * i) for i in range(10)]
    s = snap([pool(gpus=16, policy=PreemptionPolicy.LOWER_PRIORITY)],
             {"a": quota(2), "b": quota(6, borrow=4), "c": quota(4, lend=1)}, running=running, waiting=waiting)
    first = admit(s).model_dump()
    rng.shuffle(waiting)
    rng.shuffle(running)
    again = admit(s.model_copy(update={"waiting": waiting, "running": running})).model_dump()
    assert first == again == admit(s).model_dump()


# -- quotas, borrowing, lending ----------------------------------------------------------------------

def test_borrowing_limit_bounds_what_a_team_takes_and_what_it_may_ever_get() -> None:
    s = snap([pool(gpus=16)], {"a": quota(2, borrow=2), "b": quota(14)},
             running=[run(10, "a", 3)],
             waiting=[wait(1, "a", 2), wait(2, "a", 5), wait(3, "a", 1)])
    d = admit(s)
    assert admitted_ids(d) == [3]  # 3 + 1 = 4 = nominal + borrowing limit
    over = d.waiting[1][0]
    assert (over.code, over.flavor, over.requested, over.available, over.limit) == (
        ReasonCode.QUOTA_EXCEEDED, GPU, 2, 1, 4)
    never = d.waiting[2][0]
    assert (never.code, never.limit) == (ReasonCode.EXCEEDS_TEAM_LIMIT, 4)
    assert "never hold more than 4" in never.message


def test_lending_limit_caps_what_others_borrow_from_an_idle_team() -> None:
    s = snap([pool(gpus=8)], {"owner": quota(8, lend=2), "b": quota(0)},
             waiting=[wait(1, "b", 4, submitted=NOW - 100), wait(2, "b", 2, submitted=NOW - 50)])
    d = admit(s)
    assert admitted_ids(d) == [2]
    assert d.admitted[0].borrowed == 2
    r = d.waiting[1][0]
    # b may never hold more than the 2 GPUs the owner lends
    assert (r.code, r.requested, r.limit) == (ReasonCode.EXCEEDS_TEAM_LIMIT, 4, 2)


def test_capacity_no_team_owns_is_lent_to_every_team_within_its_borrowing_limit() -> None:
    s = snap([pool(gpus=8)], {"a": quota(2, borrow=3)}, waiting=[wait(1, "a", 5), wait(2, "a", 1)])
    d = admit(s)
    assert admitted_ids(d) == [1]
    assert d.admitted[0].borrowed == 3
    assert codes(d, 2) == {ReasonCode.QUOTA_EXCEEDED}


def test_a_team_without_quota_for_a_kind_may_not_run_there() -> None:
    s = snap([pool(gpus=8)], {"a": TeamQuota()}, waiting=[wait(1, "a", 1), wait(2, "nobody", 1)])
    d = admit(s)
    assert d.admitted == []
    assert codes(d, 1) == codes(d, 2) == {ReasonCode.EXCEEDS_TEAM_LIMIT}
    # a default quota for teams the snapshot does not name lets them borrow
    d2 = admit(s.model_copy(update={"default_quota": quota(0)}))
    assert admitted_ids(d2) == [2]


def test_waiting_for_capacity_when_quota_allows_but_the_pool_is_full() -> None:
    s = snap([pool(gpus=8, policy=PreemptionPolicy.NEVER)], {"a": quota(8), "b": quota(0)},
             running=[run(10, "b", 7)], waiting=[wait(1, "a", 2)])
    r = admit(s).waiting[1][0]
    assert (r.code, r.requested, r.available, r.limit) == (ReasonCode.WAITING_FOR_CAPACITY, 2, 1, 8)
    assert "pool p has 1 of 8" in r.message


# -- matching, backoff ---------------------------------------------------------------------------------

def test_no_matching_pool_names_the_kind_or_the_largest_pool() -> None:
    s = snap([pool(gpus=8)], {"a": quota(8)},
             waiting=[wait(1, "a", 1, gpu="A100-SXM-80GB"), wait(2, "a", 16), wait(3, "a", 1, backend="kubernetes"),
                      wait(4, "a", 1, pool="elsewhere")])
    d = admit(s)
    assert d.admitted == []
    for job_id in (1, 2, 3, 4):
        assert codes(d, job_id) == {ReasonCode.NO_MATCHING_POOL}
    assert d.waiting[2][0].limit == 8 and "largest matching pool has 8" in d.waiting[2][0].message
    assert "A100-SXM-80GB" in d.waiting[1][0].message


def test_a_retry_in_backoff_waits_and_others_go_ahead() -> None:
    s = snap([pool(gpus=8)], {"a": quota(8)},
             waiting=[wait(1, "a", 1, submitted=NOW - 100, not_before=NOW + 30), wait(2, "a", 1)])
    d = admit(s)
    assert admitted_ids(d) == [2]
    assert codes(d, 1) == {ReasonCode.BACKOFF}
    assert "30 s" in d.waiting[1][0].message


# -- backfill and its bound ----------------------------------------------------------------------------

def test_smaller_jobs_backfill_until_the_head_job_has_waited_reserve_after_s() -> None:
    base = snap([pool(gpus=8)], {"a": quota(0), "b": quota(0)}, running=[run(10, "a", 4)],
                waiting=[wait(1, "b", 6, submitted=NOW - 100), wait(2, "b", 2, submitted=NOW - 50)])
    assert admitted_ids(admit(base)) == [2]  # backfill: the head job has not waited long
    old = base.model_copy(update={"waiting": [wait(1, "b", 6, submitted=NOW - 1000), wait(2, "b", 2,
                                                                                     submitted=NOW - 50)]})
    d = admit(old)  # reserve_after_s = 900: the 6-GPU job holds the 4 free GPUs
    assert d.admitted == []
    r = d.waiting[2][0]
    assert r.code is ReasonCode.WAITING_FOR_PRIORITY and r.available == 0


# -- preemption ---------------------------------------------------------------------------------------

def _reclaim_snapshot(policy: PreemptionPolicy = PreemptionPolicy.RECLAIM, **kw: object) -> Snapshot:
    # b owns 4, holds 8: it borrows a's 4. a asks for 2 of its own back.
    running = [run(10, "b", 2, checkpoint=NOW - 100), run(11, "b", 2, checkpoint=NOW - 3000),
               run(12, "b", 2, started=NOW - 60), run(13, "b", 2, checkpoint=NOW - 50, started=NOW - 4000)]
    return snap([pool(gpus=8, policy=policy)], {"a": quota(4), "b": quota(4)}, running=running,
                waiting=[wait(1, "a", 2)], **kw)


def test_reclaim_preempts_the_borrower_that_loses_least_work_and_never_a_young_job() -> None:
    d = admit(_reclaim_snapshot())
    assert d.admitted == []  # the GPUs are not free until the victim is gone
    assert [(p.victim, p.by) for p in d.preempted] == [(13, 1)]  # 50 s lost; 12 is younger than 600 s
    reason = d.preempted[0].reason
    assert reason.startswith("reclaim") and "team a" in reason and "b" in reason
    assert "being preempted" in d.waiting[1][0].message


def test_min_runtime_protects_every_job_when_all_are_young() -> None:
    d = admit(_reclaim_snapshot(min_runtime_s=10_000))
    assert d.preempted == []


def test_never_more_victims_than_needed() -> None:
    running = [run(10, "b", 1, checkpoint=NOW - 10), run(11, "b", 2, checkpoint=NOW - 20),
               run(12, "b", 5, checkpoint=NOW - 30)]
    s = snap([pool(gpus=8)], {"a": quota(4), "b": quota(4)}, running=running, waiting=[wait(1, "a", 2)])
    assert [p.victim for p in admit(s).preempted] == [11]  # 10 alone is too small; with 11 it is not needed


def test_no_preemption_for_a_job_that_still_would_not_fit() -> None:
    # a may take back only 4 but needs 6 (no borrowing); nothing is preempted in vain
    s = snap([pool(gpus=8)], {"a": quota(4, borrow=0), "b": quota(4)}, running=[run(10, "b", 8)],
             waiting=[wait(1, "a", 6)])
    d = admit(s)
    assert d.preempted == []
    s2 = snap([pool(gpus=8)], {"a": quota(4), "b": quota(4)}, running=[run(10, "b", 6, started=NOW - 10),
                                                                      run(11, "b", 2)],
              waiting=[wait(1, "a", 4)])
    assert admit(s2).preempted == []  # the only old-enough borrower frees 2 of the 4 needed


def test_jobs_being_preempted_are_waited_for_not_preempted_again() -> None:
    s = _reclaim_snapshot()
    running = [r.model_copy(update={"preemptible": False}) if r.id == 13 else r for r in s.running]
    d = admit(s.model_copy(update={"running": running}))
    assert d.preempted == [] and d.admitted == []
    assert "being released" in d.waiting[1][0].message


def test_never_policy_pools_do_not_preempt() -> None:
    assert admit(_reclaim_snapshot(PreemptionPolicy.NEVER)).preempted == []


def test_lower_priority_preempts_inside_a_team_only_where_the_pool_allows_it() -> None:
    running = [run(10, "a", 8, priority=0, checkpoint=NOW - 30)]
    waiting = [wait(1, "a", 8, priority=5)]
    lower = snap([pool(gpus=8, policy=PreemptionPolicy.LOWER_PRIORITY)], {"a": quota(8)}, running=running,
                 waiting=waiting)
    d = admit(lower)
    assert [(p.victim, p.by) for p in d.preempted] == [(10, 1)]
    assert d.preempted[0].reason.startswith("priority")
    reclaim_only = lower.model_copy(update={"pools": [pool(gpus=8, policy=PreemptionPolicy.RECLAIM)]})
    assert admit(reclaim_only).preempted == []
    same_priority = lower.model_copy(update={"waiting": [wait(1, "a", 8, priority=0)]})
    assert admit(same_priority).preempted == []


def test_reclaim_takes_from_borrowers_outside_the_group_first() -> None:
    # a and b are in org x, c in org y; b and c both borrow; c's job has lost more work, but lies outside
    quotas = {"a": quota(4, group="x"), "b": quota(0, group="x"), "c": quota(0, group="y"),
              "d": quota(4, group="x")}
    running = [run(10, "b", 2, checkpoint=NOW - 10), run(11, "c", 2, checkpoint=NOW - 2000), run(12, "d", 4)]
    s = snap([pool(gpus=8)], quotas, running=running, waiting=[wait(1, "a", 2)])
    assert [p.victim for p in admit(s).preempted] == [11]


def test_a_group_takes_back_quota_lent_outside_it_before_its_own_members_borrow_elsewhere() -> None:
    # a (org x) lends its idle 4 GPUs; c (org y, nominal 0) borrows them; b (org x, nominal 0) now wants 2:
    # org x holds 4 of its 8, so b reclaims from c although b itself owns nothing
    def quotas(b_group: str | None) -> dict[str, TeamQuota]:
        return {"a": quota(4, group="x"), "d": quota(4, group="x"), "b": quota(0, group=b_group),
                "c": quota(0, group="y")}
    running = [run(10, "c", 2, checkpoint=NOW - 100), run(11, "c", 2, checkpoint=NOW - 50), run(12, "d", 4)]
    s = snap([pool(gpus=8)], quotas("x"), running=running, waiting=[wait(1, "b", 2)])
    d = admit(s)
    assert [p.victim for p in d.preempted] == [11]
    assert d.preempted[0].reason.startswith("reclaim: team b of group x") and "c" in d.preempted[0].reason
    outsider = admit(s.model_copy(update={"quotas": quotas(None)}))
    assert outsider.preempted == []  # an ungrouped borrower has no claim on org x's quota


# -- explain and eta -------------------------------------------------------------------------------------

def _queue() -> Snapshot:
    return snap([pool(gpus=4, policy=PreemptionPolicy.NEVER)], {"a": quota(0), "b": quota(0), "c": quota(0)},
                running=[run(10, "c", 4, remaining_s=100)],
                waiting=[wait(1, "a", 4, submitted=NOW - 50, predicted_s=100),
                         wait(2, "b", 4, submitted=NOW - 40, predicted_s=100),
                         wait(3, "a", 2, submitted=NOW - 30, predicted_s=100),
                         wait(4, "b", 4, submitted=NOW - 20, predicted_s=100)])


def test_explain_gives_positions_and_lists_only_the_callers_own_team() -> None:
    e = explain(_queue(), 4, "b")
    assert (e.status, e.admitted) == ("queued", False)
    assert e.position == {"team": 2, "pool": 4}
    assert [(a.job_id, a.team) for a in e.ahead] == [(2, "b")]
    assert e.ahead_other_teams == {"jobs": 2, "gpus": 6}
    got = {r.code for r in e.reasons}
    assert ReasonCode.WAITING_FOR_CAPACITY in got and ReasonCode.WAITING_FOR_PRIORITY in got
    cap = next(r for r in e.reasons if r.code is ReasonCode.WAITING_FOR_CAPACITY)
    assert (cap.flavor, cap.requested, cap.available, cap.limit) == (GPU, 4, 0, 4)
    admin = explain(_queue(), 4, None)
    assert [a.job_id for a in admin.ahead] == [1, 2, 3] and admin.ahead_other_teams == {}
    stranger = explain(_queue(), 4, "zz")
    assert stranger.ahead == [] and stranger.ahead_other_teams == {"jobs": 3, "gpus": 10}


def test_explain_of_an_admitted_or_unknown_job() -> None:
    assert explain(_queue(), 10, "c").admitted is True
    free = _queue().model_copy(update={"running": []})
    e = explain(free, 1, "a")
    assert e.admitted is True and e.reasons == [] and e.eta is not None and e.eta.latest_s == 0
    with pytest.raises(UnknownJob):
        explain(_queue(), 999, None)


def test_eta_simulates_the_queue_forward_with_a_band() -> None:
    # job 2 waits for the running job (100 s) and job 1 (100 s): 200 s, within -20%..+20%
    e = eta(_queue(), 2)
    assert (e.earliest_s, e.latest_s) == (160.0, 240.0)
    assert "simulated" in e.method
    assert explain(_queue(), 2, "b").eta == e


def test_eta_band_widens_for_unknown_durations_and_is_none_when_it_can_never_fit() -> None:
    s = _queue()
    unknown = s.model_copy(update={"running": [run(10, "c", 4)], "eta_unknown_s": 1000})
    e = eta(unknown, 1)
    assert (e.earliest_s, e.latest_s) == (0.0, 1000.0) and "unknown" in e.method
    big = s.model_copy(update={"waiting": [wait(1, "a", 16)]})
    assert eta(big, 1).earliest_s is None


def test_explain_reason_for_quota_and_backoff() -> None:
    s = snap([pool(gpus=8)], {"a": quota(1, borrow=0)}, running=[run(10, "a", 1)],
             waiting=[wait(1, "a", 1), wait(2, "a", 1, not_before=NOW + 60)])
    assert [r.code for r in explain(s, 1, "a").reasons] == [ReasonCode.QUOTA_EXCEEDED]
    e = explain(s, 2, "a")
    assert [r.code for r in e.reasons] == [ReasonCode.BACKOFF]
    assert e.eta is not None and e.eta.earliest_s is not None and e.eta.earliest_s >= 60


def test_explain_says_when_a_job_can_never_run_here() -> None:
    s = snap([pool(gpus=8)], {"a": quota(2, borrow=1)},
             waiting=[wait(1, "a", 4), wait(2, "a", 16), wait(3, "a", 1, gpu="A100-SXM-80GB")])
    too_big_for_team = explain(s, 1, "a")
    assert [(r.code, r.requested, r.limit) for r in too_big_for_team.reasons] == [
        (ReasonCode.EXCEEDS_TEAM_LIMIT, 4, 3)]
    too_big_for_pool = explain(s, 2, "a")
    assert [(r.code, r.requested, r.limit) for r in too_big_for_pool.reasons] == [
        (ReasonCode.NO_MATCHING_POOL, 16, 8)]
    no_kind = explain(s, 3, "a")
    assert [r.code for r in no_kind.reasons] == [ReasonCode.NO_MATCHING_POOL]
    for e in (too_big_for_team, too_big_for_pool, no_kind):
        assert e.eta is not None and e.eta.earliest_s is None and e.eta.latest_s is None


# -- costs -------------------------------------------------------------------------------------------------

def test_kind_cost_comes_from_the_pool_or_the_catalog_relative_to_an_a100() -> None:
    assert kind_cost("A100-SXM-80GB") == pytest.approx(1.0)
    assert kind_cost("H100-SXM-80GB") == pytest.approx(989 / 312)
    assert kind_cost("L40S-48GB") < kind_cost("H100-SXM-80GB")
    assert kind_cost("H100-SXM-80GB", [pool(gpus=8).model_copy(update={"cost": 2.0})]) == 2.0
    assert kind_cost("no-such-gpu") == 1.0


def test_past_usage_of_costlier_gpus_weighs_more_in_the_order() -> None:
    # a used H100s in the past, b as many L40S GPU-seconds: b goes first
    pools = [pool("h", 8), pool("l", 8, gpu="L40S-48GB")]
    quotas = {t: TeamQuota(flavors={GPU: FlavorQuota(nominal=0), "L40S-48GB": FlavorQuota(nominal=0)})
              for t in ("a", "b")}
    s = snap(pools, quotas, waiting=[wait(1, "a", 1, submitted=NOW - 100), wait(2, "b", 1)],
             usage={"a": {GPU: 1000.0}, "b": {"L40S-48GB": 1000.0}})
    assert admit(s).order == [2, 1]


# -- invariants ------------------------------------------------------------------------------------------

@settings(max_examples=150, deadline=None)
@given(snapshots())
def test_admission_never_exceeds_capacity_or_quota_and_is_deterministic(s: Snapshot) -> None:
    d = admit(s)
    assert d.model_dump() == admit(s).model_dump()
    assert sorted(d.order) == sorted(j.id for j in s.waiting)
    jobs = {j.id: j for j in s.waiting}
    used = {p.name: sum(r.gpus for r in s.running if r.pool == p.name) for p in s.pools}
    usage: dict[tuple[str, str], int] = {}
    for r in s.running:
        usage[(r.team, r.gpu)] = usage.get((r.team, r.gpu), 0) + r.gpus
    touched = set()
    for a in d.admitted:
        j = jobs[a.job_id]
        pool_ = next(p for p in s.pools if p.name == a.pool)
        assert (pool_.gpu, pool_.backend.value) == (j.gpu, j.backend)
        used[a.pool] += j.gpus
        usage[(j.team, j.gpu)] = usage.get((j.team, j.gpu), 0) + j.gpus
        touched.add((j.team, j.gpu))
        assert a.job_id not in d.waiting
    for p in s.pools:
        assert used[p.name] <= p.gpus or not any(a.pool == p.name for a in d.admitted)
    for team, kind in touched:
        fq = s.quotas[team].flavors[kind]
        if fq.borrowing_limit is not None:
            assert usage[(team, kind)] <= fq.nominal + fq.borrowing_limit
    victims = {r.id: r for r in s.running}
    admitted_now = {a.job_id for a in d.admitted}
    for pre in d.preempted:
        v = victims[pre.victim]
        assert v.preemptible and NOW - (v.started_at or v.admitted_at) >= s.min_runtime_s
        assert pre.by not in admitted_now
    assert len({p.victim for p in d.preempted}) == len(d.preempted)


def test_past_usage_of_a_kind_no_pool_has_counts_in_fair_share_without_failing() -> None:
    """A pool removed since: its kind's past usage (at catalog cost) still counts in the share."""
    s = snap([pool("p", 8)], {"a": quota(8), "b": quota(8)},
             waiting=[wait(1, "a", 1, submitted=NOW - 100), wait(2, "b", 1)],
             usage={"a": {"L40S-48GB": 1000.0}, "b": {"L40S-48GB": 10.0}})
    d = admit(s)
    assert d.order == [2, 1]
    assert [a.job_id for a in d.admitted] == [2, 1]



def test_no_preemption_when_what_is_being_released_already_makes_room() -> None:
    """Team t0 is at its quota (nominal 1 + borrowing 2): 2 GPUs in a lower-priority pool with 1 free,
    and 1 in another pool being released. Its higher-priority job of 1 GPU fits in the free GPU once
    that release gives the quota back, so nothing is preempted and the job waits for the release. (A
    preemption without victims used to be chosen here, and writing its reason raised KeyError for a
    team of no group; Hypothesis found it in tests/scheduling/test_fast_paths.py.)"""
    pools = [pool("p0", 3, PreemptionPolicy.LOWER_PRIORITY, backend="kubernetes"),
             pool("p2", 1, PreemptionPolicy.NEVER)]
    running = [run(1001, "t0", 2, pool_name="p0", started=NOW - 600, checkpoint=NOW - 600),
               run(1002, "t0", 1, pool_name="p2", started=NOW, preemptible=False)]
    s = snap(pools, {"t0": quota(1, borrow=2)}, running=running,
             waiting=[wait(1, "t0", 1, priority=1, backend="kubernetes")])
    for reasons in (True, False):
        d = admit(s, reasons=reasons)
        assert d.preempted == [] and d.admitted == []
    assert "quota is in use" in admit(s).waiting[1][0].message
