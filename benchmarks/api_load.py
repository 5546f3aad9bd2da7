"""API load: submissions per second and read latency with 100,000 jobs in PostgreSQL.

Creates a fresh database (`shardctl_bench_<random>`, dropped at the end), migrates it, bulk-inserts
`--jobs` realistic jobs (spec and plan of a real `plan()`, spread over teams, statuses and backends,
one `job.queued` event each), mints an admin and a member token, starts the API as a separate
process (`uvicorn --factory service.api.app:create_app`) and drives it from this process with
`--concurrency` asyncio tasks sharing one client, only against 127.0.0.1: by default the lean client
of `http_clients` (prebuilt requests on keep-alive sockets, uvloop), so that the load generator takes
little of the CPUs it shares with the server; `--client httpx` drives it with httpx as tooling would.
It measures:

1. submissions/s of `POST /v1/jobs` (member token, the `llama-tiny` preset on `gpu: cpu`), and jobs/s
   through `POST /v1/jobs:batch` (`BATCH_SIZE` specs a request);
2. p50/p99 latency of `GET /v1/jobs/{id}` over random ids, alone (concurrency 1) and under load;
3. p50/p99 of a filtered list `GET /v1/jobs?status=QUEUED&team=T&limit=50` and of its second page
   (the cursor the first page returned), alone and under load;
4. for comparison, the same reads as raw SQL through psycopg (what a user with database access would
   otherwise do), and the CPU time the server spent per request.

It prints a table with each figure next to the goal (500 submissions/s at 16 clients; a p99 read under
20 ms at one client and under 50 ms at 16, on a 2-core machine), figure/goal, and the references
measured in the same run: `/healthz` throughput (the framework's floor) and raw SQL for the reads.
It always exits 0 once it has measured: it is a measurement, not a test.

    .venv/bin/python benchmarks/api_load.py --postgres-url "$(deploy/postgres.sh)"
        [--jobs 100000] [--submissions 1000] [--reads 2000] [--concurrency 16] [--workers 1]

(one command line; about 6 minutes with these sizes). Run it on an otherwise idle machine: it prints
the background CPU load and the machine's speed (`side_by_side.machine_speed`) it saw before and after, and flags
figures taken on a busy machine.

`--against DIR` compares this tree with another checkout of shardctl in the same run (made with
`git worktree add DIR REV`; both must have the same migration head, since they share the database):
a second API server runs DIR's code (its working directory and first import path), every phase runs
on both servers taking turns (`--turns` times each, the order flipped each turn so that drift in the
machine's speed falls on both), and a side-by-side table gives each phase's server CPU per request
and p99 on both trees, with the ratio. The goals table is this tree's.

The PostgreSQL URL (its role needs CREATEDB) defaults to $SHARDCTL_TEST_POSTGRES_URL, else the
`shardctl` role on 127.0.0.1:5432 that `deploy/postgres.sh` sets up.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
from http_clients import CLIENTS, Client
from http_clients import run as run_loop
from scratch_db import scratch_database
from side_by_side import add_against, machine_speed, trees
from sqlalchemy import JSON, column, create_engine, insert, select, table, text
from sqlalchemy.engine import make_url

from service.api.routers.health import PID_HEADER
from service.planner import plan
from service.spec import TrainingSpec
from service.store.db import make_sessionmaker
from service.store.models import Event, Job, Team
from service.store.tokens import create_token
from service.store.vocab import Role

DEFAULT_URL = "postgresql+psycopg://shardctl:shardctl@127.0.0.1:5432/shardctl"
GOAL_SUBMISSIONS_PER_S = 500.0
GOAL_P99_READ_MS = 20.0  # at one client
GOAL_P99_READ_LOADED_MS = 50.0  # at --concurrency (16) clients
BATCH_SIZE = 100  # specs per POST /v1/jobs:batch
TEAMS = ("alpha", "beta", "gamma", "delta")
MEMBER_TEAM = TEAMS[0]
STATUSES = {"SUCCEEDED": 50, "FAILED": 10, "CANCELLED": 5, "QUEUED": 15, "PENDING": 5, "RUNNING": 15}
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
BACKENDS = {"slurm": 5, "kubernetes": 4, "local": 1}
BATCH = 5000
TINY: dict[str, Any] = {
    "name": "tiny",
    "model": {"preset": "llama-tiny"},
    "training": {"global_batch": 8, "precision": "fp32", "steps": 5},
    "resources": {"gpu": "cpu", "gpus_per_node": 2, "nodes": 1},
}


# ---------------------------------------------------------------- database


@dataclass(frozen=True)
class Seeded:
    jobs: int
    seconds: float
    admin_token: str
    member_token: str
    db_bytes: int


def _choices(rng: random.Random, weights: dict[str, int], n: int) -> list[str]:
    return rng.choices(list(weights), weights=list(weights.values()), k=n)


def seed(url: str, n_jobs: int, rng: random.Random) -> Seeded:
    """Bulk-insert `n_jobs` jobs (ids 1..n) and their `job.queued` events; mint the two tokens."""
    start = time.perf_counter()
    base = TrainingSpec.model_validate(TINY)
    planned = plan(base)
    plan_doc = planned.model_dump(mode="json")
    engine = create_engine(url)
    with engine.begin() as conn:
        team_ids = {t: int(conn.execute(insert(Team).values(name=t, created_at=datetime.now(UTC))
                                        .returning(Team.id)).scalar_one()) for t in TEAMS}
    specs = {(t, b): TrainingSpec.model_validate({**TINY, "team": t, "backend": {"kind": b}}).model_dump(mode="json")
             for t in TEAMS for b in BACKENDS}
    event_data = {"layout": plan_doc["layout"], "step_s": planned.time.step_s}
    layout = planned.layout.short()  # the list-view columns create_job fills
    # The documents are already JSON: insert them past the typed columns, which would re-validate each row.
    job_rows = table("jobs", *(column(c.name) for c in Job.__table__.columns if c.name not in ("spec", "plan")),
                     column("spec", JSON()), column("plan", JSON()))
    t0 = datetime.now(UTC) - timedelta(seconds=n_jobs * 30)
    for lo in range(1, n_jobs + 1, BATCH):
        hi = min(lo + BATCH, n_jobs + 1)
        size = hi - lo
        teams, statuses, backends = rng.choices(TEAMS, k=size), _choices(rng, STATUSES, size), \
            _choices(rng, BACKENDS, size)
        jobs: list[dict[str, Any]] = []
        events: list[dict[str, Any]] = []
        for k, job_id in enumerate(range(lo, hi)):
            created = t0 + timedelta(seconds=job_id * 30)
            updated = created + timedelta(seconds=rng.randint(1, 7200))
            status = statuses[k]
            jobs.append({
                "id": job_id, "name": f"run-{teams[k]}-{job_id % 977}", "team_id": team_ids[teams[k]],
                "status": status, "backend": backends[k], "priority": rng.choice((0, 0, 0, 10, 100)),
                "spec": specs[(teams[k], backends[k])], "plan": plan_doc, "created_by": "admin:seed",
                "layout": layout, "predicted_step_s": event_data["step_s"],
                "created_at": created, "updated_at": updated,
                "finished_at": updated if status in TERMINAL else None,
                "lease_owner": None, "lease_expires_at": None})
            events.append({"job_id": job_id, "at": created, "actor": "admin:seed", "kind": "job.queued",
                           "message": "planned and queued", "data": event_data})
        with engine.begin() as conn:
            conn.execute(insert(job_rows), jobs)
            conn.execute(insert(Event), events)
    with engine.begin() as conn:
        conn.execute(text("SELECT setval(pg_get_serial_sequence('jobs', 'id'), :n)"), {"n": max(n_jobs, 1)})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))
        db_bytes = int(conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one())
    with make_sessionmaker(engine).begin() as session:
        _, admin_token = create_token(session, role=Role.ADMIN, name="bench admin")
        member_team = session.scalars(select(Team).where(Team.name == MEMBER_TEAM)).one()
        _, member_token = create_token(session, role=Role.MEMBER, team=member_team, name="bench member")
    engine.dispose()
    return Seeded(n_jobs, time.perf_counter() - start, admin_token, member_token, db_bytes)


# ---------------------------------------------------------------- server


class SessionCounter:
    """Connections ever opened to the bench database (`pg_stat_database.sessions`, PostgreSQL 14+), read
    over one connection of its own: a figure above the pool's size means the server opens and closes
    connections under load."""

    def __init__(self, url: str) -> None:
        dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        self.conn = psycopg.connect(dsn, autocommit=True)

    def read(self) -> int:
        time.sleep(1.1)  # backends report their statistics at most once a second
        self.conn.execute("SELECT pg_stat_clear_snapshot()")
        row = self.conn.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()"
                                ).fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    def close(self) -> None:
        self.conn.close()


def background_load(seconds: float = 1.0) -> float:
    """How many of the machine's CPUs something else keeps busy, over `seconds` of idling here."""
    before = machine_cpu_seconds()
    time.sleep(seconds)
    return (machine_cpu_seconds() - before) / seconds


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _proc_stats() -> dict[int, tuple[str, int, float]]:
    """pid -> (command name, parent pid, user + system CPU seconds), from Linux /proc (empty elsewhere)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    stats: dict[int, tuple[str, int, float]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            head, tail = (entry / "stat").read_text().rsplit(")", 1)
            fields = tail.split()
            stats[int(entry.name)] = (head.split("(", 1)[1], int(fields[1]),
                                      (int(fields[11]) + int(fields[12])) / tick)
        except (OSError, IndexError, ValueError):
            continue
    return stats


def machine_cpu_seconds() -> float:
    """Busy CPU seconds of the whole machine since boot, all cores together (Linux; 0.0 elsewhere)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return 0.0
    busy = [int(x) for i, x in enumerate(fields) if i not in (3, 4)]  # all but idle and iowait
    return sum(busy[:6]) / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)


def _tree_cpu_seconds(root: int) -> float:
    """User + system CPU seconds of `root` and its descendants (Linux /proc; 0.0 elsewhere)."""
    stats = {pid: (ppid, cpu) for pid, (_, ppid, cpu) in _proc_stats().items()}
    wanted, total, grew = {root}, 0.0, True
    while grew:
        grew = False
        for pid, (ppid, _) in stats.items():
            if ppid in wanted and pid not in wanted:
                wanted.add(pid)
                grew = True
    for pid in wanted:
        total += stats.get(pid, (0, 0.0))[1]
    return total


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    base: str
    log: Path

    def cpu_seconds(self) -> float:
        return _tree_cpu_seconds(self.process.pid)


SERVE_WORKERS_MODULE = ("service", "cli", "serve_workers.py")
SERVE_WORKERS = """
import sys
from service.cli.serve_workers import serve_workers
sys.exit(serve_workers(sys.argv[1], factory=True, host="127.0.0.1", port=int(sys.argv[2]), workers=int(sys.argv[3]),
                       log_level="warning", access_log=False))
"""
"""Several workers as `shardctl serve --workers N` runs them, a listening socket each; a tree from
before `service/cli/serve_workers.py` runs uvicorn's supervisor, as its serve did."""


@contextmanager
def api_server(url: str, workers: int, workdir: Path, tree: Path | None = None) -> Iterator[Server]:
    """The API in its own process on a free localhost port, once `/healthz` answers (with `workers` above
    1, as that tree's `shardctl serve --workers` runs them: `SERVE_WORKERS`). `tree`: run that
    checkout's `service` instead of the installed one (`python -m` puts its working directory first on
    the import path, so the process runs in `tree` and has it on PYTHONPATH too)."""
    port = _free_port()
    log = workdir / "uvicorn.log"
    env = {**os.environ, "SHARDCTL_DATABASE_URL": url, "SHARDCTL_DATA_DIR": str(workdir)}
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-m", "uvicorn", "--factory", "service.api.app:create_app", "--host", "127.0.0.1",
           "--port", str(port), "--log-level", "warning", "--no-access-log", "--workers", str(workers)]
    if workers > 1 and (tree or Path(__file__).resolve().parents[1]).joinpath(*SERVE_WORKERS_MODULE).exists():
        cmd = [sys.executable, "-c", SERVE_WORKERS, "service.api.app:create_app", str(port), str(workers)]
    with log.open("wb") as out:
        process = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=tree)
    server = Server(process, f"http://127.0.0.1:{port}", log)
    try:
        deadline, answered = time.monotonic() + 60, set[str]()
        # Every worker up before the phases start: a phase's connections are opened once and kept.
        while len(answered) < workers:
            if process.poll() is not None:
                raise RuntimeError(f"the API server exited ({process.returncode}):\n{log.read_text()[-3000:]}")
            try:
                answer = httpx.get(server.base + "/healthz", timeout=1)
                if answer.status_code == 200:
                    if PID_HEADER not in answer.headers:  # a tree that does not say which worker answered
                        break
                    answered.add(answer.headers[PID_HEADER])
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(answered)} of {workers} API workers answered /healthz in 60 s:\n"
                                   f"{log.read_text()[-3000:]}")
            time.sleep(0.1 if not answered else 0.01)
        yield server
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


# ---------------------------------------------------------------- load


Request = Callable[[Client, int], Awaitable[tuple[float, int]]]
"""Performs request number i; returns (seconds, HTTP status)."""


@dataclass
class Phase:
    label: str
    concurrency: int
    latencies: list[float] = field(default_factory=list)
    errors: dict[int, int] = field(default_factory=dict)
    wall_s: float = 0.0
    client_cpu_s: float = 0.0
    server_cpu_s: float = 0.0
    machine_cpu_s: float = 0.0
    new_connections: int | None = None

    @property
    def ok(self) -> int:
        return len(self.latencies)

    @property
    def rate(self) -> float:
        return self.ok / self.wall_s if self.wall_s else 0.0

    @property
    def other_cpu_s(self) -> float:
        """The machine's CPU time that was neither the server's nor the client's: PostgreSQL, mostly."""
        return max(0.0, self.machine_cpu_s - self.server_cpu_s - self.client_cpu_s)

    def pct_ms(self, q: float) -> float:
        return percentile(self.latencies, q) * 1000

    def add(self, more: Phase) -> None:
        """Take in another turn of the same phase: its requests, errors, time and CPU."""
        self.latencies += more.latencies
        for status, n in more.errors.items():
            self.errors[status] = self.errors.get(status, 0) + n
        self.wall_s += more.wall_s
        self.client_cpu_s += more.client_cpu_s
        self.server_cpu_s += more.server_cpu_s
        self.machine_cpu_s += more.machine_cpu_s
        if more.new_connections is not None:
            self.new_connections = (self.new_connections or 0) + more.new_connections

    @property
    def server_ms(self) -> float:
        """Server CPU milliseconds per answered request."""
        return self.server_cpu_s * 1000 / max(self.ok, 1)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), -(-len(ordered) * q // 100)))
    return ordered[int(rank) - 1]


async def timed(client: Client, method: str, path: str, **kw: Any) -> tuple[float, int, bytes]:
    start = time.perf_counter()
    status, body = await client.request(method, path, **kw)
    return time.perf_counter() - start, status, body


def run_phase(label: str, server: Server, token: str, request: Request, count: int, concurrency: int,
              max_seconds: float, ok_status: int = 200, sessions: SessionCounter | None = None,
              client_kind: str = "lean", first: int = 0) -> Phase:
    """`count` requests (numbers `first` on) from `concurrency` asyncio tasks sharing one keep-alive
    client of `client_kind` (`http_clients.CLIENTS`; a closed loop: each task sends its next request
    when the previous one is answered), for at most `max_seconds`. Records the latencies of the
    requests answered with `ok_status` and counts the others."""
    phase = Phase(label, concurrency)
    end = first + count

    async def drive() -> None:
        next_i = first
        deadline = time.monotonic() + max_seconds

        async def worker(client: Client) -> None:
            nonlocal next_i
            while time.monotonic() < deadline and next_i < end:
                i, next_i = next_i, next_i + 1
                try:
                    seconds, status = await request(client, i)
                except (httpx.HTTPError, ConnectionError):
                    seconds, status = 0.0, -1
                if status == ok_status:
                    phase.latencies.append(seconds)
                else:
                    phase.errors[status] = phase.errors.get(status, 0) + 1

        client = CLIENTS[client_kind](server.base, token, concurrency)
        try:
            await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        finally:
            await client.aclose()

    sessions0 = sessions.read() if sessions else 0
    cpu0, server0, machine0 = time.process_time(), server.cpu_seconds(), machine_cpu_seconds()
    start = time.perf_counter()
    run_loop(drive(), client_kind)
    phase.wall_s = time.perf_counter() - start
    phase.client_cpu_s = time.process_time() - cpu0
    phase.server_cpu_s = server.cpu_seconds() - server0
    phase.machine_cpu_s = machine_cpu_seconds() - machine0
    if sessions:
        phase.new_connections = sessions.read() - sessions0
    return phase


def in_turns(servers: list[Server], count: int, turns: int, run: Callable[[Server, int, int], Phase]) -> list[Phase]:
    """A phase of `count` requests on each of `servers`, in `turns` turns: turn t runs its share of the
    requests (the same request numbers on every server) on each server in turn, the order reversed
    every other turn. `run(server, first, share)` runs one turn; returns one Phase per server, its
    turns added up."""
    totals: dict[int, Phase] = {}
    for turn in range(turns):
        first, share = count * turn // turns, count * (turn + 1) // turns - count * turn // turns
        order = list(range(len(servers)))
        for k in order if turn % 2 == 0 else order[::-1]:
            got = run(servers[k], first, share)
            if k in totals:
                totals[k].add(got)
            else:
                totals[k] = got
    return [totals[k] for k in range(len(servers))]


async def healthz_request(client: Client, i: int) -> tuple[float, int]:
    """The framework's floor: a sync handler that touches no database (and checks no token)."""
    seconds, status, _ = await timed(client, "GET", "/healthz")
    return seconds, status


def submit_request(run_id: str) -> Request:
    async def do(client: Client, i: int) -> tuple[float, int]:
        body = {**TINY, "name": f"bench-{run_id}-{i}"}
        seconds, status, _ = await timed(client, "POST", "/v1/jobs", json_body=body)
        return seconds, status
    return do


def batch_request(run_id: str) -> Request:
    """`BATCH_SIZE` specs per request; the phase's rate counts requests (x BATCH_SIZE for jobs/s)."""
    async def do(client: Client, i: int) -> tuple[float, int]:
        body = {"specs": [{**TINY, "name": f"batch-{run_id}-{i}-{k}"} for k in range(BATCH_SIZE)]}
        seconds, status, _ = await timed(client, "POST", "/v1/jobs:batch", json_body=body)
        return seconds, status
    return do


def get_request(n_jobs: int, seed_: int) -> Request:
    async def do(client: Client, i: int) -> tuple[float, int]:
        job_id = random.Random(seed_ * 1_000_003 + i).randint(1, n_jobs)
        seconds, status, _ = await timed(client, "GET", f"/v1/jobs/{job_id}")
        return seconds, status
    return do


def list_requests(seed_: int) -> tuple[Request, Request]:
    """(first page, second page) of `status=QUEUED&team=T&limit=50` for a random team; request i of the
    second page follows the cursor that request i of the first page returned (a first page without a
    cursor counts as a 204 'error' of the second)."""
    cursors: dict[int, str | None] = {}

    def params(i: int) -> dict[str, str | int]:
        team = random.Random(seed_ * 1_000_003 + i).choice(TEAMS)
        return {"status": "QUEUED", "team": team, "limit": 50}

    async def first(client: Client, i: int) -> tuple[float, int]:
        seconds, status, body = await timed(client, "GET", "/v1/jobs", params=params(i))
        cursors[i] = json.loads(body).get("next_cursor") if status == 200 else None
        return seconds, status

    async def second(client: Client, i: int) -> tuple[float, int]:
        cursor = cursors.get(i)
        if cursor is None:
            return 0.0, 204
        seconds, status, _ = await timed(client, "GET", "/v1/jobs", params={**params(i), "cursor": cursor})
        return seconds, status

    return first, second


# ---------------------------------------------------------------- the alternative: raw SQL


RAW_GET = """
SELECT j.id, j.name, t.name, j.status, j.backend, j.priority, j.spec, j.plan, j.created_at, j.updated_at,
       j.finished_at
FROM jobs j JOIN teams t ON t.id = j.team_id WHERE j.id = %s"""
#: The columns the API's list page reads (`service.store.jobs.list_job_rows`), not the whole plan of each job.
RAW_LIST = """
SELECT j.id, j.name, j.team_id, j.status, j.backend, j.priority, j.created_at, j.updated_at, j.finished_at,
       j.layout, j.predicted_step_s, j.gpus, t.name
FROM jobs j JOIN teams t ON t.id = j.team_id
WHERE j.status = 'QUEUED' AND t.name = %s ORDER BY j.id DESC LIMIT 51"""


def raw_sql(url: str, n_jobs: int, reads: int, seed_: int) -> tuple[Phase, Phase]:
    """The same reads as one SQL query each over one psycopg connection, sequentially."""
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    get, listing = Phase("raw SQL: job by id", 1), Phase("raw SQL: filtered list", 1)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for phase, query in ((get, RAW_GET), (listing, RAW_LIST)):
            cpu0, machine0, start = time.process_time(), machine_cpu_seconds(), time.perf_counter()
            for i in range(reads):
                rng = random.Random(seed_ * 1_000_003 + i)
                arg: int | str = rng.randint(1, n_jobs) if query is RAW_GET else rng.choice(TEAMS)
                t = time.perf_counter()
                conn.execute(query, (arg,)).fetchall()
                phase.latencies.append(time.perf_counter() - t)
            phase.wall_s = time.perf_counter() - start
            phase.client_cpu_s = time.process_time() - cpu0
            phase.machine_cpu_s = machine_cpu_seconds() - machine0
    return get, listing


# ---------------------------------------------------------------- report


def print_report(seeded: Seeded, phases: dict[str, Phase], raw: tuple[Phase, Phase], workers: int,
                 busy: tuple[float, float], speed: tuple[float, float], client_kind: str) -> None:
    sub = phases["submit"]
    print(f"\nshardctl API load — {seeded.jobs} jobs seeded in {seeded.seconds:.1f} s "
          f"(database {seeded.db_bytes / 2**20:.0f} MiB), API server: uvicorn, {workers} worker(s), "
          f"{os.cpu_count()} CPU(s), load generator: this process ({client_kind} client)")
    print(f"background load (CPUs busy with other work, 1 s idle sample): {busy[0]:.2f} before, "
          f"{busy[1]:.2f} after" + ("  <- the figures are pessimistic" if max(busy) > 0.25 else ""))
    print(f"machine speed (side_by_side.machine_speed, ms of CPU for a fixed piece of Python, lower is faster):"
          f" {speed[0]:.1f} before, {speed[1]:.1f} after\n")
    rows: list[tuple[str, float, float | None, bool]] = []  # label, figure, goal, higher is better
    rows.append((f"POST /v1/jobs submissions/s (c={sub.concurrency})", sub.rate, GOAL_SUBMISSIONS_PER_S, True))
    rows.append((f"POST /v1/jobs p50 ms (c={sub.concurrency})", sub.pct_ms(50), None, False))
    rows.append((f"POST /v1/jobs p99 ms (c={sub.concurrency})", sub.pct_ms(99), None, False))
    healthz = phases["healthz-n"]
    rows.append((f"  ref: GET /healthz req/s (c={healthz.concurrency})", healthz.rate, None, True))
    rows.append(("  submissions/s as a fraction of /healthz req/s", sub.rate / healthz.rate if healthz.rate else 0.0,
                 None, True))
    batch = phases["batch"]
    rows.append((f"POST /v1/jobs:batch jobs/s ({BATCH_SIZE}/request, c={batch.concurrency})",
                 batch.rate * BATCH_SIZE, GOAL_SUBMISSIONS_PER_S, True))
    rows.append((f"POST /v1/jobs:batch p99 ms per request (c={batch.concurrency})", batch.pct_ms(99), None, False))
    for key, what in (("healthz", "GET /healthz (no db, no auth)"), ("get", "GET /v1/jobs/{id}"),
                      ("list1", "GET /v1/jobs?status&team p1"),
                      ("list2", "GET /v1/jobs?...&cursor p2")):
        for c_key in ("1", "n"):
            phase = phases[f"{key}-{c_key}"]
            tag = f"{what} (c={phase.concurrency})"
            rows.append((f"{tag} p50 ms", phase.pct_ms(50), None, False))
            read_goal = GOAL_P99_READ_MS if phase.concurrency == 1 else GOAL_P99_READ_LOADED_MS
            rows.append((f"{tag} p99 ms", phase.pct_ms(99), None if key == "healthz" else read_goal, False))
    raw_get, raw_list = raw
    rows.append((f"{raw_get.label} p50 ms (c=1)", raw_get.pct_ms(50), None, False))
    rows.append((f"{raw_get.label} p99 ms (c=1)", raw_get.pct_ms(99), None, False))
    rows.append((f"{raw_list.label} p50 ms (c=1)", raw_list.pct_ms(50), None, False))
    rows.append((f"{raw_list.label} p99 ms (c=1)", raw_list.pct_ms(99), None, False))

    print(f"{'measure':52} {'figure':>9} {'goal':>7} {'figure/goal':>11}  meets")
    for label, figure, goal, higher in rows:
        if goal is None:
            print(f"{label:52} {figure:9.2f} {'':>7} {'':>11}")
            continue
        meets = figure >= goal if higher else figure <= goal
        print(f"{label:52} {figure:9.2f} {goal:7.0f} {figure / goal:11.2f}  {'yes' if meets else 'NO'}")

    print(f"\n{'phase':34} {'ok':>6} {'errors':>12} {'wall s':>7} {'req/s':>7} {'new conns':>9}"
          f"   CPU ms per request: {'server':>7} {'other':>8} {'client':>7}")
    for phase in (*phases.values(), raw_get, raw_list):
        errors = ",".join(f"{k}:{v}" for k, v in sorted(phase.errors.items())) or "-"
        n = max(phase.ok, 1)
        conns = "-" if phase.new_connections is None else str(phase.new_connections)
        print(f"{phase.label + f' c={phase.concurrency}':34} {phase.ok:6d} {errors:>12} {phase.wall_s:7.2f}"
              f" {phase.rate:7.1f} {conns:>9} {'':>22}{phase.server_cpu_s * 1000 / n:7.2f}"
              f" {phase.other_cpu_s * 1000 / n:8.2f} {phase.client_cpu_s * 1000 / n:7.2f}")
    get1 = phases["get-1"]
    list1 = phases["list1-1"]
    print(f"\nAPI overhead over raw SQL (p50, c=1): GET by id x{get1.pct_ms(50) / raw_get.pct_ms(50):.1f}, "
          f"filtered list x{list1.pct_ms(50) / raw_list.pct_ms(50):.1f}")
    print("errors: HTTP status:count (-1 = transport error; 204 on page 2 = page 1 had no cursor).\n"
          "new conns: PostgreSQL connections opened during the phase (0 when the server's pool is enough).\n"
          "CPU: server = the uvicorn process tree; client = this process; other = the rest of the machine\n"
          "(PostgreSQL, and anything else running); all share the machine's CPUs.")


def print_side_by_side(mine: dict[str, Phase], theirs: dict[str, Phase], other: Path, turns: int) -> None:
    """Each phase on this tree and on `other`, measured taking turns in this run."""
    print(f"\nthis tree against {other}, each phase in {turns} turns per tree taking turns"
          " (ratio below 1: this tree is faster or cheaper)")
    print(f"{'phase':34} {'server CPU ms/request':>34}   {'p99 ms':>30}   {'req/s':>20}")
    print(f"{'':34} {'this':>10} {'other':>10} {'ratio':>12}   {'this':>9} {'other':>9} {'ratio':>10}"
          f"   {'this':>9} {'other':>10}")
    for key, a in mine.items():
        b = theirs[key]
        print(f"{a.label + f' c={a.concurrency}':34} {a.server_ms:10.2f} {b.server_ms:10.2f}"
              f" {a.server_ms / b.server_ms if b.server_ms else float('nan'):12.2f}"
              f"   {a.pct_ms(99):9.2f} {b.pct_ms(99):9.2f} {a.pct_ms(99) / b.pct_ms(99):10.2f}"
              f"   {a.rate:9.1f} {b.rate:10.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--postgres-url", default=os.environ.get("SHARDCTL_TEST_POSTGRES_URL", DEFAULT_URL),
                        help="a PostgreSQL URL whose role may CREATE DATABASE")
    parser.add_argument("--jobs", type=int, default=100_000, help="jobs to seed")
    parser.add_argument("--submissions", type=int, default=1000, help="POST /v1/jobs requests")
    parser.add_argument("--reads", type=int, default=2000, help="requests of each read phase")
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent clients of the loaded phases")
    parser.add_argument("--workers", "--server-workers", dest="server_workers", type=int, default=1,
                        help="API server processes (uvicorn --workers, as `shardctl serve --workers`)")
    parser.add_argument("--batches", type=int, default=20, help=f"POST /v1/jobs:batch requests of {BATCH_SIZE}")
    parser.add_argument("--max-seconds", type=float, default=90.0, help="time limit of each phase")
    parser.add_argument("--client", choices=sorted(CLIENTS), default="lean",
                        help="the load generator's HTTP client (see http_clients)")
    add_against(parser, "each phase takes turns on both trees' servers")
    parser.add_argument("--turns", type=int, default=4, help="with --against: turns each phase takes per tree")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.jobs < 1 or args.concurrency < 1 or args.turns < 1:
        parser.error("--jobs, --concurrency and --turns must be at least 1")
    measured_trees = trees(parser, args.against)
    rng = random.Random(args.seed)
    run_id = secrets.token_hex(3)
    started = time.perf_counter()

    busy_before, speed_before = background_load(), machine_speed()
    with (tempfile.TemporaryDirectory(prefix="shardctl-bench-") as tmp,
          scratch_database(args.postgres_url, "api") as url):
        print(f"seeding {args.jobs} jobs into {make_url(url).database} ...", flush=True)
        seeded = seed(url, args.jobs, rng)
        print(f"seeded in {seeded.seconds:.1f} s; starting the API server ...", flush=True)
        # Counting connections reads statistics a second apart: too slow to do per turn.
        sessions = SessionCounter(url) if args.against is None else None
        turns = 1 if args.against is None else args.turns
        results: list[dict[str, Phase]] = [{} for _ in measured_trees]
        try:
            with ExitStack() as stack:
                servers = []
                for k, tree in enumerate(measured_trees):
                    (Path(tmp) / str(k)).mkdir()
                    servers.append(stack.enter_context(api_server(url, args.server_workers, Path(tmp) / str(k), tree)))
                c, limit = args.concurrency, args.max_seconds
                measure = functools.partial(run_phase, client_kind=args.client)
                admin, member = seeded.admin_token, seeded.member_token
                first, second = list_requests(args.seed)

                def phase(key: str, label: str, token: str, request: Request, count: int, conc: int,
                          ok_status: int = 200) -> None:
                    got = in_turns(servers, count, turns, lambda server, start, share: measure(
                        label, server, token, request, share, conc, limit, ok_status=ok_status, sessions=sessions,
                        first=start))
                    for mine, one in zip(results, got, strict=True):
                        mine[key] = one

                for server in servers:  # warm-up: connection pools, imports, PostgreSQL caches
                    measure("warm-up", server, admin, get_request(args.jobs, args.seed + 7), 200, c, limit)
                    measure("warm-up", server, admin, first, 100, c, limit)
                print("submitting ...", flush=True)
                phase("submit", "POST /v1/jobs", member, submit_request(run_id), args.submissions, c, ok_status=201)
                phase("batch", "POST /v1/jobs:batch", member, batch_request(run_id), args.batches, min(c, 4),
                      ok_status=201)
                print("reading ...", flush=True)
                for c_key, conc in (("1", 1), ("n", c)):
                    for key, label, request in (
                            ("healthz", "GET /healthz (floor)", healthz_request),
                            ("get", "GET /v1/jobs/{id}", get_request(args.jobs, args.seed)),
                            ("list1", "GET /v1/jobs list p1", first),
                            ("list2", "GET /v1/jobs list p2", second)):
                        phase(f"{key}-{c_key}", label, admin, request, args.reads, conc)
        finally:
            if sessions is not None:
                sessions.close()
        raw = raw_sql(url, args.jobs, args.reads, args.seed)
        busy_after, speed_after = background_load(), machine_speed()
        print_report(seeded, results[0], raw, args.server_workers, (busy_before, busy_after),
                     (speed_before, speed_after), args.client)
        if args.against is not None:
            print_side_by_side(results[0], results[1], args.against, turns)
    print(f"\ntotal {time.perf_counter() - started:.0f} s; database dropped")


if __name__ == "__main__":
    main()
