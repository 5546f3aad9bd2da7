"""Server CPU per job heartbeat, in PostgreSQL, next to the framework's own `/healthz`.

It creates its own database `shardctl_bench_heartbeats_<random>` on the server of `--postgres-url`
(`scratch_db`: migrated, dropped at the end, also on errors), inserts `--jobs` RUNNING jobs and mints
each its job token (as the dispatcher does at submission). It starts the API as its own process
(`uvicorn --factory service.api.app:create_app`, as `benchmarks/api_load.py` does) and, `--rounds`
times, every job posts one heartbeat (`POST /v1/jobs/{id}/measurements`, kind `heartbeat`, the `data`
the runtime sends: step, loss, tokens/s) with its own token over one keep-alive connection, one request
at a time; each round is followed by as many `GET /healthz` (no auth, no database): the floor any
request through this server and framework costs. The figure is the CPU time of the API server's
process (Linux /proc, user + system) per request, so the load generator's own CPU is not counted,
and heartbeat - healthz is the heartbeat's own server work (authentication, the body's checks, the
handler and its database round trips; PostgreSQL's own CPU is another process and not counted).

Goal: 1,000 running jobs, one heartbeat each every 10 s, under 10% of one core: at most 1 ms of
server CPU per heartbeat beyond the floor. It prints the implied share of one core at `--jobs` /
`--every-s` per second.

    .venv/bin/python benchmarks/heartbeats.py [--jobs 1000] [--rounds 3] [--every-s 10] [--postgres-url URL]
        [--against DIR]

`--against DIR` runs another checkout's API (`git worktree add DIR REV`) beside this tree's, on the same
database, the two taking turns round by round (the order flipped every other round), and prints both
and their ratios: one run, one machine state.

It exits 0 whether or not the goal is met: it is a measurement, not a test. Run it on a quiet machine:
it prints the load average and the machine's speed (`side_by_side.machine_speed`) before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from api_load import Server, api_server
from scratch_db import scratch_database
from side_by_side import add_against, machine_speed, postgres_server, trees
from sqlalchemy import JSON, column, insert, table, text

from service.planner import plan
from service.spec import TrainingSpec
from service.store.db import make_engine, make_sessionmaker
from service.store.models import Job, Team
from service.store.tokens import create_token
from service.store.vocab import Role

TINY: dict[str, Any] = {"name": "bench", "model": {"preset": "llama-tiny"},
                        "training": {"global_batch": 2, "precision": "fp32", "steps": 100},
                        "resources": {"gpu": "cpu", "gpus_per_node": 1, "nodes": 1}}
GOAL_RATE = 1000 / 10  # heartbeats a second: 1,000 running jobs, one every 10 s each
GOAL_SHARE = 0.10  # of one core, at that rate
GOAL_MS = GOAL_SHARE * 1000 / GOAL_RATE  # server CPU per heartbeat: 1 ms


def seed(url: str, n_jobs: int) -> dict[int, str]:
    """`n_jobs` RUNNING jobs; returns job id -> its job token."""
    spec = TrainingSpec.model_validate(TINY)
    planned = plan(spec)
    engine = make_engine(url)
    now = datetime.now(UTC)
    with engine.begin() as conn:
        team = int(conn.execute(insert(Team).values(name="bench", created_at=now).returning(Team.id)).scalar_one())
        rows = table("jobs", *(column(c.name) for c in Job.__table__.columns if c.name not in ("spec", "plan")),
                     column("spec", JSON()), column("plan", JSON()))
        conn.execute(insert(rows), [
            {"id": i, "name": f"bench-{i}", "team_id": team, "status": "RUNNING", "backend": "local", "priority": 0,
             "spec": spec.model_dump(mode="json"), "plan": planned.model_dump(mode="json"), "layout": "dp1",
             "predicted_step_s": 1.0, "created_by": "admin:seed", "created_at": now, "updated_at": now,
             "finished_at": None, "lease_owner": None, "lease_expires_at": None, "gpu": "cpu", "gpus": 1,
             "pool": None, "admitted_at": now, "predicted_s": 100.0} for i in range(1, n_jobs + 1)])
        conn.execute(text("SELECT setval(pg_get_serial_sequence('jobs', 'id'), :n)"), {"n": n_jobs})
    tokens = {}
    with make_sessionmaker(engine).begin() as session:
        for job_id in range(1, n_jobs + 1):
            tokens[job_id] = create_token(session, role=Role.JOB, job_id=job_id, name=f"shardctl-{job_id}-1")[1]
    engine.dispose()
    return tokens


@dataclass
class Measured:
    """Server CPU per request of one tree's API, per round (ms)."""

    beat_ms: list[float] = field(default_factory=list)
    health_ms: list[float] = field(default_factory=list)
    client_ms: list[float] = field(default_factory=list)

    @property
    def beat(self) -> float:
        return statistics.median(self.beat_ms)

    @property
    def health(self) -> float:
        return statistics.median(self.health_ms)

    @property
    def own(self) -> float:
        return self.beat - self.health


def one_round(server: Server, tokens: dict[int, str], step: int, into: Measured) -> None:
    """Every job posts one heartbeat to `server`, then as many `GET /healthz`; adds the figures to `into`."""
    with httpx.Client(base_url=server.base, timeout=30) as client:
        def heartbeat(job_id: int, token: str) -> None:
            r = client.post(f"/v1/jobs/{job_id}/measurements", headers={"Authorization": f"Bearer {token}"},
                            json={"kind": "heartbeat", "data": {"step": step, "loss": 2.5, "tokens_per_s": 4096.0}})
            if r.status_code != 201:
                raise SystemExit(f"heartbeat of job {job_id} answered {r.status_code}: {r.text}")

        for job_id, token in list(tokens.items())[:50]:  # warm-up: the connection, the pool, prepared statements
            heartbeat(job_id, token)
            client.get("/healthz")
        start, mine = server.cpu_seconds(), time.process_time()
        for job_id, token in tokens.items():
            heartbeat(job_id, token)
        into.beat_ms.append((server.cpu_seconds() - start) * 1000 / len(tokens))
        into.client_ms.append((time.process_time() - mine) * 1000 / len(tokens))
        start = server.cpu_seconds()
        for _ in tokens:
            client.get("/healthz")
        into.health_ms.append((server.cpu_seconds() - start) * 1000 / len(tokens))


def report(label: str, m: Measured, jobs: int, every_s: float) -> None:
    rate = jobs / every_s
    print(f"-- {label}")
    print(f"{'API server CPU':<26} {'ms/request (median of rounds)':>30}  rounds")
    print(f"{'heartbeat':<26} {m.beat:>30.3f}  " + " ".join(f"{v:.3f}" for v in m.beat_ms))
    print(f"{'/healthz (the floor)':<26} {m.health:>30.3f}  " + " ".join(f"{v:.3f}" for v in m.health_ms))
    print(f"{'heartbeat - healthz':<26} {m.own:>30.3f}  goal <= {GOAL_MS:.1f}")
    print(f"ratio heartbeat/healthz: {m.beat / m.health:.2f}; the load generator's CPU per heartbeat (not"
          f" counted above): {statistics.median(m.client_ms):.3f} ms")
    print(f"at {jobs:,} jobs every {every_s:.0f} s ({rate:.0f}/s): {rate * m.beat / 10:.1f}% of one core"
          f" for the API server, {rate * m.own / 10:.1f}% for the heartbeat's own work")
    print(f"goal: at 1,000 jobs every 10 s, under {GOAL_SHARE:.0%} of one core; the server's whole CPU (the"
          f" request's floor included) {GOAL_RATE * m.beat / 10:.2f}%: {'yes' if m.beat < GOAL_MS else 'NO'};"
          f" the heartbeat's own work {GOAL_RATE * m.own / 10:.2f}%: {'yes' if m.own < GOAL_MS else 'NO'}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--every-s", type=float, default=10.0)
    p.add_argument("--postgres-url", default=os.environ.get("SHARDCTL_TEST_POSTGRES_URL"))
    add_against(p, "its API takes turns with this tree's on the same database, round by round")
    args = p.parse_args(argv)
    measured_trees = trees(p, args.against)
    base = postgres_server(args.postgres_url)
    load = os.getloadavg()
    print(f"== heartbeats: {args.jobs:,} running jobs, one heartbeat each per round, PostgreSQL, the API in its"
          f" own process; load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs;"
          f" machine speed {machine_speed():.1f} ms"
          " (side_by_side.machine_speed: lower is faster)")
    with scratch_database(base, "heartbeats") as url, tempfile.TemporaryDirectory(prefix="shardctl-bench-") as tmp, \
            ExitStack() as stack:
        tokens = seed(url, args.jobs)
        servers = []
        for i, tree in enumerate(measured_trees):
            workdir = Path(tmp) / f"tree-{i}"
            workdir.mkdir()
            servers.append(stack.enter_context(api_server(url, 1, workdir, tree)))
        measured = [Measured() for _ in measured_trees]
        for rnd in range(args.rounds):
            order = list(range(len(measured_trees)))
            if rnd % 2:  # every other round the other tree goes first, so that drift in the machine is shared
                order.reverse()
            for i in order:
                one_round(servers[i], tokens, 10 * (rnd + 1), measured[i])
        report("this tree", measured[0], args.jobs, args.every_s)
        if args.against is not None:
            report(f"{args.against}, taking turns round by round", measured[1], args.jobs, args.every_s)
            mine, theirs = measured
            print(f"-- this tree / {args.against}: heartbeat {mine.beat / theirs.beat:.2f},"
                  f" heartbeat - healthz {mine.own / theirs.own:.2f}, healthz {mine.health / theirs.health:.2f}")
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())};"
              f" machine speed {machine_speed():.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
