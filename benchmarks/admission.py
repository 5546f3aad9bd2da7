"""One admission cycle and one explain call on a large queue, next to their goals.

The queue: 10,000 waiting jobs across 100 teams (10 groups) and 20 pools (4 GPU kinds x 5 pools,
mixed preemption policies), with the pools mostly full of running jobs (a third of them borrowing),
past usage for every team, a few retries in backoff: a fixed seed, so every run measures the same
snapshot. Prints the median and p95 wall time of the dispatcher's cycle, `engine.admit(s,
reasons=False)` (goal: under 50 ms), of the full `engine.admit(s)` with every waiting job's reasons
and the whole order (no goal: the API and tests use it, the dispatcher does not), and of
`engine.explain` for a job in the middle of the queue (goal: under 20 ms), over N runs each, and the
least CPU time (the steadiest figure on a shared machine).

    .venv/bin/python benchmarks/admission.py [--runs N] [--jobs 10000] [--teams 100] [--pools 20]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from service.scheduling.engine import admit, explain
from service.scheduling.queue_view import queue_view
from service.scheduling.state import Snapshot

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support: the snapshot generator
from tests.support.snapshots import make_snapshot


def measure(fn: Callable[[], object], runs: int) -> tuple[float, float, float]:
    """(median wall, p95 wall, least CPU) seconds over `runs` calls after one warm-up."""
    fn()
    walls: list[float] = []
    cpus: list[float] = []
    for _ in range(runs):
        w, c = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    walls.sort()
    p95 = walls[min(len(walls) - 1, round(0.95 * (len(walls) - 1)))]
    return statistics.median(walls), p95, min(cpus)


def reference_loop_ns() -> float:
    """ns per iteration of a plain dict-lookup loop: how fast this machine runs Python right now
    (compare figures from different machines, or from a loaded one, through it)."""
    table = {i: i for i in range(100)}
    best = math.inf
    for _ in range(5):
        start = time.perf_counter()
        for i in range(100_000):
            table.get(i % 100)
        best = min(best, time.perf_counter() - start)
    return best / 100_000 * 1e9


def view_store(url: str, snap: Snapshot) -> tuple[sessionmaker[Session], float]:
    """A migrated database at `url` holding the queue view of `snap`; and the seconds the write took."""
    from service.store.db import make_engine, make_sessionmaker
    from service.store.migrate import upgrade
    from service.store.models import utcnow
    from service.store.queue_view import write_view

    upgrade(url)
    sessions = make_sessionmaker(make_engine(url))
    entries = queue_view(snap)
    started = time.perf_counter()
    with sessions.begin() as session:
        write_view(session, entries, computed_at=utcnow(), seconds=0.0)
    return sessions, time.perf_counter() - started


def read_view(sessions: sessionmaker[Session], job_id: int, viewer: str | None) -> Callable[[], object]:
    from service.store.models import utcnow
    from service.store.queue_view import read_explanation

    def read() -> object:
        with sessions.begin() as session:
            got = read_explanation(session, job_id, viewer, now=utcnow(), max_age_s=1e9)
        assert got is not None
        return got
    return read


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--teams", type=int, default=100)
    parser.add_argument("--pools", type=int, default=20)
    parser.add_argument("--postgres", help="also read the view from this PostgreSQL (its tables are replaced)")
    args = parser.parse_args()
    snap = make_snapshot(args.jobs, args.teams, args.pools)
    decision = admit(snap)
    middle = decision.order[len(decision.order) // 2]
    target_team = next(j.team for j in snap.waiting if j.id == middle)
    print(f"snapshot: {len(snap.waiting)} waiting, {len(snap.running)} running, {len(snap.quotas)} teams,"
          f" {len(snap.pools)} pools; one cycle admits {len(decision.admitted)} and preempts"
          f" {len(decision.preempted)}")
    print(f"reference loop: {reference_loop_ns():.0f} ns per iteration (plain dict lookups; lower is a faster machine)")
    fast = admit(snap, reasons=False)
    print(f"the dispatcher's cycle (reasons=False) walks {len(fast.order)} of {len(decision.order)} jobs"
          " before it provably settles")
    cases: list[tuple[str, float | None, Callable[[], object]]] = [
        ("admit: one cycle (dispatcher, reasons=False)", 0.050, lambda: admit(snap, reasons=False)),
        ("admit: one cycle with every reason and order", None, lambda: admit(snap)),
    ]
    stores: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        stores.append(("sqlite", f"sqlite:///{tmp}/view.db"))
        if args.postgres:
            stores.append(("postgres", args.postgres))
        writes = []
        for name, url in stores:
            sessions, wrote = view_store(url, snap)
            writes.append(f"{name} {wrote * 1e3:.0f} ms")
            cases += [(f"why pending, from the view ({name}): team", 0.020, read_view(sessions, middle, target_team)),
                      (f"why pending, from the view ({name}): admin", 0.020, read_view(sessions, middle, None))]
        cases += [("why pending, live (engine.explain): team", 0.020, lambda: explain(snap, middle, target_team)),
                  ("refresh the view: queue_view(s), no write", None, lambda: queue_view(snap))]
        print(f"job {middle} (mid-queue, team {target_team}); writing the view once took {', '.join(writes)}")
        run_cases(cases, args.runs)


def run_cases(cases: list[tuple[str, float | None, Callable[[], object]]], runs: int) -> None:
    print(f"{'case':46} {'median ms':>9} {'p95 ms':>7} {'min cpu ms':>10} {'goal ms':>7} {'goal/median':>11}")
    for label, goal, fn in cases:
        median, p95, cpu = measure(fn, runs)
        goals = f"{goal * 1e3:7.0f} {goal / median:11.2f}" if goal is not None else f"{'-':>7} {'-':>11}"
        print(f"{label:46} {median * 1e3:9.1f} {p95 * 1e3:7.1f} {cpu * 1e3:10.1f} {goals}")


if __name__ == "__main__":
    main()
