"""What calibration from measurements costs a store with many finished jobs.

It migrates a fresh database (a temporary SQLite file, or a new database on the server of
`--postgres-url`, dropped at the end), bulk-inserts `--jobs` succeeded jobs, each with one `report`
measurement and three heartbeats, then measures, in CPU seconds of this process (`time.process_time`;
PostgreSQL's own work is another process) and wall seconds:

- **reference, full read**: every report read into samples from an empty cursor, then the fit (what a
  recompute from scratch on each read would cost);
- **incremental**: `--new` more reports arrive, then `calibration.current` (reads only those, refits);
- **unchanged**: `calibration.current` with nothing new (one query for new reports, one for the
  newest sample; the fit is reused).

Rounds alternate incremental and unchanged (`--rounds`); the full read is measured `--full` times
between them.

    .venv/bin/python benchmarks/calibration.py [--jobs 10000] [--new 20] [--rounds 5] [--full 2]
        [--postgres-url URL]

Goals: incremental under 50 ms and unchanged under 5 ms with 10,000 jobs. It exits 0 whether or not
they are met.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from scratch_db import scratch_database
from sqlalchemy import delete, insert
from sqlalchemy.orm import Session, sessionmaker

from service.jobenv import MeasurementKind
from service.planner import plan
from service.spec import TrainingSpec
from service.store import calibration, migrate
from service.store.calibration_models import CalibrationCursor, CalibrationSample
from service.store.db import make_engine, make_sessionmaker
from service.store.jobs import NewJob
from service.store.models import Measurement
from service.store.submissions import insert_jobs
from service.store.tokens import ensure_team

SPEC = TrainingSpec.model_validate({
    "name": "bench", "model": {"preset": "llama-tiny"},
    "training": {"global_batch": 8, "precision": "fp32", "steps": 5},
    "resources": {"gpu": "cpu", "gpus_per_node": 2, "nodes": 1}})
GOAL_INCREMENTAL_S = 0.050
GOAL_UNCHANGED_S = 0.005


@contextmanager
def database(postgres_url: str | None) -> Iterator[str]:
    if postgres_url is None:
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite:///{Path(tmp) / 'bench.db'}"
            migrate.upgrade(url)
            yield url
        return
    with scratch_database(postgres_url, "calibration") as url:
        yield url


def report_of(step: float) -> dict[str, Any]:
    p = PLAN
    m = p.memory
    peak = m.total - m.runtime_overhead - m.allocator_margin
    return {"status": "succeeded", "plan": p.name, "layout": p.layout.to_dict(), "world_size": p.world_size,
            "device": "cpu", "steps": 5,
            "predicted": {"params": m.params, "grads": m.grads, "optimizer": m.optimizer, "peak_allocated": peak,
                          "peak_reserved": m.total - m.runtime_overhead, "total": m.total, "step_s": p.time.step_s,
                          "tokens_per_s": p.time.tokens_per_s, "mfu": p.time.mfu},
            "measured": {"step_s": p.time.step_s * step, "peak": peak * 1.05}, "ratios": {}}


PLAN = plan(SPEC)


def add_jobs(sessions: sessionmaker[Session], count: int, seed: int) -> None:
    """`count` jobs, each with three heartbeats and a report (steps spread around 1.2x the model)."""
    done = 0
    while done < count:
        n = min(500, count - done)
        with sessions.begin() as session:
            team = ensure_team(session, "bench")
            jobs = insert_jobs(session, [NewJob(team=team, spec=SPEC, plan=PLAN)] * n, actor="bench")
            rows: list[dict[str, Any]] = []
            for i, job in enumerate(jobs):
                rows += [{"job_id": job.id, "kind": MeasurementKind.HEARTBEAT, "data": {"step": s}} for s in range(3)]
                rows.append({"job_id": job.id, "kind": MeasurementKind.REPORT,
                             "data": report_of(1.2 + 0.01 * ((seed + done + i) % 7 - 3))})
            session.execute(insert(Measurement), rows)
        done += n


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - cpu, time.perf_counter() - wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--new", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--full", type=int, default=2)
    parser.add_argument("--postgres-url", default=None)
    args = parser.parse_args()
    load = os.getloadavg()
    with database(args.postgres_url) as url:
        engine = make_engine(url)
        sessions = make_sessionmaker(engine)
        start = time.perf_counter()
        add_jobs(sessions, args.jobs, 0)
        print(f"store: {engine.dialect.name}, {args.jobs:,} succeeded jobs with a report and 3 heartbeats each"
              f" (inserted in {time.perf_counter() - start:.1f} s)")

        def current() -> None:
            with sessions.begin() as session:
                calibration.current(session)

        def full() -> None:
            with sessions.begin() as session:
                session.execute(delete(CalibrationSample))
                session.execute(delete(CalibrationCursor))
            current()

        fulls: list[tuple[float, float]] = []
        incs: list[tuple[float, float]] = []
        sames: list[tuple[float, float]] = []
        for r in range(args.rounds):
            if r < args.full:
                fulls.append(timed(full))
            add_jobs(sessions, args.new, r + 1)
            incs.append(timed(current))
            sames.append(timed(current))
        with sessions.begin() as session:
            cal = calibration.current(session)
        engine.dispose()
    [group] = cal.groups
    assert group.step is not None

    def med(xs: list[tuple[float, float]], i: int) -> float:
        return statistics.median(x[i] for x in xs)

    full_cpu = med(fulls, 0)
    print(f"fit: {group.family} on {group.gpu}, {group.runs} runs (window), step factor x{group.step.value:.3f}")
    print(f"{'':34} {'CPU s':>9} {'wall s':>9} {'goal s':>8} {'CPU/goal':>9} {'CPU/full':>9}")
    print(f"{'reference: full read of reports':34} {full_cpu:9.4f} {med(fulls, 1):9.4f} {'':>8} {'':>9} {1:9.3f}")
    for name, xs, goal in ((f"incremental ({args.new} new reports)", incs, GOAL_INCREMENTAL_S),
                           ("unchanged (nothing new)", sames, GOAL_UNCHANGED_S)):
        cpu = med(xs, 0)
        print(f"{name:34} {cpu:9.4f} {med(xs, 1):9.4f} {goal:8.3f} {cpu / goal:9.3f} {cpu / full_cpu:9.3f}")
    print(f"medians of {args.rounds} rounds ({args.full} full reads); load average before the run:"
          f" {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
