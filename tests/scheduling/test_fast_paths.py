"""The engine's fast paths decide exactly what its full path decides.

- `admit(s, reasons=False)` (the dispatcher's call: it skips provably inert jobs and stops once the
  cycle has settled) gives the same `admitted` and `preempted`, in the same order, as `admit(s)`,
  and its `order` is a prefix of the full one;
- `explain` and `eta` (which skip provably inert jobs ahead of the target, and once the cycle has
  settled every job of another GPU kind) answer what they answer when every job is placed
  (`_inert` switched off, no settle check: the walk the engine made before the fast paths).

Over random snapshots (the engine tests' strategy, a richer one here with pins, backoffs, jobs
being released, groups and both backends) and the benchmark's generator at a few seeds and sizes,
with the settle check run after every placement as well as at its normal interval. No timings
here: `benchmarks/admission.py` prints those.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.admission import make_snapshot
from service.scheduling import engine
from service.scheduling.model import FlavorQuota, Pool, PreemptionPolicy, TeamQuota
from service.scheduling.state import RunningJob, Snapshot, WaitingJob
from tests.scheduling.builders import NOW
from tests.scheduling.test_engine import snapshots

KINDS = ["H100-SXM-80GB", "L40S-48GB"]


@st.composite
def busy_snapshots(draw: st.DrawFn) -> Snapshot:
    """Up to 5 pools on two backends, 6 teams in up to two groups, up to 70 waiting jobs (some
    pinned, some in backoff, some new), running jobs of which some are being released."""
    policies = list(PreemptionPolicy)
    pools = [Pool.model_validate({"name": f"p{i}", "backend": ("slurm", "kubernetes")[draw(st.integers(0, 1))],
                                  "gpu": KINDS[i % 2], "gpus": draw(st.integers(1, 16)),
                                  "preemption": draw(st.sampled_from(policies))})
             for i in range(draw(st.integers(1, 5)))]
    teams = [f"t{i}" for i in range(draw(st.integers(1, 6)))]
    quotas = {t: TeamQuota(weight=draw(st.sampled_from([0.0, 0.5, 1.0, 2.0])),
                           group=draw(st.sampled_from([None, "x", "y"])),
                           flavors={k: FlavorQuota(nominal=draw(st.integers(0, 10)),
                                                   borrowing_limit=draw(st.one_of(st.none(), st.integers(0, 8))),
                                                   lending_limit=draw(st.one_of(st.none(), st.integers(0, 8))))
                                    for k in KINDS if draw(st.booleans())})
              for t in teams if draw(st.integers(0, 5))}
    running: list[RunningJob] = []
    jid = 1000
    for p in pools:
        left = p.gpus
        while left > 0 and draw(st.integers(0, 5)):
            g = draw(st.integers(1, min(left, 4)))
            left -= g
            jid += 1
            started = NOW - draw(st.integers(0, 4000))
            running.append(RunningJob(
                id=jid, team=draw(st.sampled_from(teams)), pool=p.name, gpu=p.gpu, gpus=g,
                priority=draw(st.integers(0, 2)), admitted_at=started, started_at=started,
                checkpoint_at=started + draw(st.integers(0, 100)), preemptible=draw(st.integers(0, 6)) > 0))
    waiting = []
    for i in range(1, draw(st.integers(0, 70)) + 1):
        kind = draw(st.sampled_from(KINDS))
        same_kind = [p for p in pools if p.gpu == kind]
        backend = draw(st.sampled_from([p.backend.value for p in same_kind])) if same_kind else "slurm"
        pin = draw(st.sampled_from([None, None, None, *[p.name for p in same_kind]]))
        waiting.append(WaitingJob(
            id=i, team=draw(st.sampled_from(teams)), backend=backend, gpu=kind, gpus=draw(st.integers(1, 8)),
            priority=draw(st.integers(0, 2)), submitted_at=NOW - draw(st.sampled_from([10, 500, 1000, 5000])),
            pool=pin, not_before=draw(st.sampled_from([None, None, None, NOW + 60, NOW - 60]))))
    usage = {t: {k: float(draw(st.integers(0, 1000))) for k in KINDS} for t in teams if draw(st.booleans())}
    return Snapshot(now=NOW, pools=pools, quotas=quotas, running=running, waiting=waiting, usage=usage,
                    reserve_after_s=draw(st.sampled_from([0.0, 900.0, 1e9])))


@pytest.fixture(params=[1, engine.SETTLE_CHECK_EVERY], ids=["check-every-placement", "check-default"])
def settle_every(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    monkeypatch.setattr(engine, "SETTLE_CHECK_EVERY", request.param)
    yield request.param


def _assert_same_decisions(s: Snapshot) -> None:
    full = engine.admit(s)
    fast = engine.admit(s, reasons=False)
    assert fast.admitted == full.admitted
    assert fast.preempted == full.preempted
    assert fast.order == full.order[:len(fast.order)]
    assert fast.waiting == {}


def _unskipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Place every job (the walk before the fast paths): no job is found inert."""
    monkeypatch.setattr(engine, "_inert", lambda c, j, now: False)


def _assert_same_explanations(s: Snapshot, ids: list[int]) -> None:
    """The same answers with inert jobs skipped (settle checked after every placement, and at the
    normal interval: once settled, other kinds' jobs are skipped too) as with every job placed."""
    teams = {j.id: j.team for j in s.waiting}
    answers = []
    for every in (1, engine.SETTLE_CHECK_EVERY):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(engine, "SETTLE_CHECK_EVERY", every)
            answers.append([(engine.explain(s, i, None), engine.explain(s, i, teams[i]), engine.eta(s, i))
                            for i in ids])
    with pytest.MonkeyPatch.context() as mp:
        _unskipped(mp)
        mp.setattr(engine, "SETTLE_CHECK_EVERY", 10**9)
        slow = [(engine.explain(s, i, None), engine.explain(s, i, teams[i]), engine.eta(s, i)) for i in ids]
    assert answers[0] == slow
    assert answers[1] == slow


@settings(max_examples=150, deadline=None)
@given(s=snapshots())
def test_fast_admit_matches_full_on_engine_snapshots(s: Snapshot) -> None:
    for every in (1, engine.SETTLE_CHECK_EVERY):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(engine, "SETTLE_CHECK_EVERY", every)
            _assert_same_decisions(s)


@settings(max_examples=120, deadline=None)
@given(s=busy_snapshots())
def test_fast_admit_matches_full_on_busy_snapshots(s: Snapshot) -> None:
    for every in (1, 7, engine.SETTLE_CHECK_EVERY):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(engine, "SETTLE_CHECK_EVERY", every)
            _assert_same_decisions(s)


@settings(max_examples=150, deadline=None)
@given(s=busy_snapshots())
def test_explain_and_eta_match_the_unskipped_walk(s: Snapshot) -> None:
    _assert_same_explanations(s, [j.id for j in s.waiting][:12])


@pytest.mark.parametrize(("seed", "jobs", "teams", "pools"), [
    (12, 10_000, 100, 20), (1, 3000, 30, 8), (2, 2000, 10, 4), (3, 600, 6, 5), (4, 1200, 100, 20)])
def test_fast_admit_matches_full_on_benchmark_snapshots(seed: int, jobs: int, teams: int, pools: int,
                                                        settle_every: int) -> None:
    _assert_same_decisions(make_snapshot(jobs, teams, pools, seed))


@pytest.mark.parametrize(("seed", "jobs", "teams", "pools"), [(12, 10_000, 100, 20), (5, 1500, 20, 8)])
def test_explain_matches_the_unskipped_walk_on_benchmark_snapshots(seed: int, jobs: int, teams: int,
                                                                    pools: int) -> None:
    s = make_snapshot(jobs, teams, pools, seed)
    order = engine.admit(s).order
    picks = [order[0], order[len(order) // 10], order[len(order) // 2], order[-1]]
    _assert_same_explanations(s, picks)


@pytest.mark.parametrize("seed", [12, 3])
def test_a_queue_in_admission_order_skips_the_sort_with_the_same_decisions(seed: int) -> None:
    ordered = make_snapshot(3000, 30, 8, seed, presorted=True)
    by_id = make_snapshot(3000, 30, 8, seed, presorted=False)
    assert ordered.waiting_in_order and not by_id.waiting_in_order and ordered.waiting != by_id.waiting
    assert engine.admit(ordered) == engine.admit(by_id)
    assert engine.admit(ordered, reasons=False) == engine.admit(by_id, reasons=False)


def test_fast_admit_settles_early_on_the_benchmark_queue() -> None:
    """Not a timing: the dispatcher's call walks a small part of a saturated queue."""
    s = make_snapshot()
    fast = engine.admit(s, reasons=False)
    assert len(fast.order) < len(s.waiting) // 2
