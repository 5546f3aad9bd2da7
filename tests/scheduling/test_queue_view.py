"""The queue view answers exactly what `engine.explain` answers, for every waiting job at once.

Over random snapshots (the fast-path tests' busy strategy: pins, backoffs, jobs being released,
groups, both backends) and the benchmark's generator: for each waiting job, the view's entry with
the entries ahead of it gives `engine.explain`'s answer for its own team and for an admin; and the
forecast of the whole queue gives each job the band `engine.eta` gives it alone.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings

from service.scheduling import engine
from service.scheduling.queue_view import QueueEntry, from_view, queue_view
from service.scheduling.state import Snapshot
from tests.support.snapshot_strategies import busy_snapshots
from tests.support.snapshots import make_snapshot


def _assert_view_matches_explain(s: Snapshot, sample: int | None = None) -> list[QueueEntry]:
    view = queue_view(s)
    assert [e.job_id for e in view] == engine.admit(s).order
    assert [e.order for e in view] == list(range(len(view)))
    picks = view if sample is None else [view[i * (len(view) - 1) // (sample - 1)] for i in range(sample)]
    for entry in picks:
        ahead = view[:entry.order]
        for viewer in (entry.team, None):
            live = engine.explain(s, entry.job_id, viewer)
            assert from_view(entry, ahead, viewer) == live, (entry.job_id, viewer)
        # a caller handing only the viewer's own team's rows ahead gets the same
        own = [a for a in ahead if a.team == entry.team]
        assert from_view(entry, own, entry.team) == engine.explain(s, entry.job_id, entry.team)
    return view


@settings(max_examples=120, deadline=None)
@given(s=busy_snapshots())
def test_view_matches_explain_for_every_waiting_job(s: Snapshot) -> None:
    _assert_view_matches_explain(s)


@pytest.mark.parametrize(("seed", "jobs", "teams", "pools"), [(5, 1500, 20, 8), (12, 10_000, 100, 20)])
def test_view_matches_explain_on_benchmark_snapshots(seed: int, jobs: int, teams: int, pools: int) -> None:
    view = _assert_view_matches_explain(make_snapshot(jobs, teams, pools, seed), sample=5)
    # the forecast is the queue's: a job never starts before a waiting job ahead of it that may use
    # the same pools (no backfill past a competitor)
    by_pools: dict[tuple[str, tuple[str, ...]], list[QueueEntry]] = {}
    for e in view:
        if not e.admitted and e.eta and e.eta.earliest_s is not None:
            by_pools.setdefault((e.gpu, tuple(e.pools)), []).append(e)
    assert max(len(v) for v in by_pools.values()) > 10
    for entries in by_pools.values():
        for before, after in itertools.pairwise(entries):
            assert after.eta and before.eta
            assert after.eta.earliest_s >= before.eta.earliest_s  # type: ignore[operator]
