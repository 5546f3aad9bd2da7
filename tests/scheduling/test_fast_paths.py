"""The engine's one fast path decides exactly what its full path decides.

`admit(s, reasons=False)` (the dispatcher's call: it stops walking once the cycle has settled, no
remaining job able to be admitted or to preempt) gives the same `admitted` and `preempted`, in the
same order, as `admit(s)`, and its `order` is a prefix of the full one.

Over random snapshots (the engine tests' strategy, a richer one here with pins, backoffs, jobs
being released, groups and both backends) and the benchmark's generator at a few seeds and sizes,
with the settle check run after every placement as well as at its normal interval. No timings
here: `benchmarks/admission.py` prints those (on the same generator, `tests.support.snapshots`).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings

from service.scheduling import cycle
from service.scheduling.engine import admit
from service.scheduling.state import Snapshot
from tests.support.snapshot_strategies import busy_snapshots, snapshots
from tests.support.snapshots import make_snapshot


@pytest.fixture(params=[1, cycle.SETTLE_CHECK_EVERY], ids=["check-every-placement", "check-default"])
def settle_every(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    monkeypatch.setattr(cycle, "SETTLE_CHECK_EVERY", request.param)
    yield request.param


def _assert_same_decisions(s: Snapshot) -> None:
    full = admit(s)
    fast = admit(s, reasons=False)
    assert fast.admitted == full.admitted
    assert fast.preempted == full.preempted
    assert fast.order == full.order[:len(fast.order)]
    assert fast.waiting == {}


@settings(max_examples=150, deadline=None)
@given(s=snapshots())
def test_fast_admit_matches_full_on_engine_snapshots(s: Snapshot) -> None:
    for every in (1, cycle.SETTLE_CHECK_EVERY):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(cycle, "SETTLE_CHECK_EVERY", every)
            _assert_same_decisions(s)


@settings(max_examples=120, deadline=None)
@given(s=busy_snapshots())
def test_fast_admit_matches_full_on_busy_snapshots(s: Snapshot) -> None:
    for every in (1, 7, cycle.SETTLE_CHECK_EVERY):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(cycle, "SETTLE_CHECK_EVERY", every)
            _assert_same_decisions(s)


@pytest.mark.parametrize(("seed", "jobs", "teams", "pools"), [
    (12, 10_000, 100, 20), (1, 3000, 30, 8), (2, 2000, 10, 4), (3, 600, 6, 5), (4, 1200, 100, 20)])
def test_fast_admit_matches_full_on_benchmark_snapshots(seed: int, jobs: int, teams: int, pools: int,
                                                        settle_every: int) -> None:
    _assert_same_decisions(make_snapshot(jobs, teams, pools, seed))


@pytest.mark.parametrize("seed", [12, 3])
def test_the_order_the_queue_comes_in_does_not_change_the_decision(seed: int) -> None:
    ordered = make_snapshot(3000, 30, 8, seed, presorted=True)
    by_id = make_snapshot(3000, 30, 8, seed, presorted=False)
    assert ordered.waiting != by_id.waiting
    assert admit(ordered) == admit(by_id)
    assert admit(ordered, reasons=False) == admit(by_id, reasons=False)


def test_fast_admit_settles_early_on_the_benchmark_queue() -> None:
    """Not a timing: the dispatcher's call walks a small part of a saturated queue."""
    s = make_snapshot()
    fast = admit(s, reasons=False)
    assert len(fast.order) < len(s.waiting) // 2
