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
here: `benchmarks/admission.py` prints those (on the same generator, `tests.support.snapshots`).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings

from service.scheduling import engine
from service.scheduling.state import Snapshot
from tests.support.snapshot_strategies import busy_snapshots, snapshots
from tests.support.snapshots import make_snapshot


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
