"""CPU per request through the API's ASGI app, in process: no HTTP, no server process.

`heartbeats.py` and `api_load.py` measure a real server from a second process. That is what a user
gets, but on two shared cores their server CPU per request moves by a quarter to a half from one round
to the next with the same code (where the server's threads and PostgreSQL's backend happen to run).
This one calls the app (`create_app`, on a scratch PostgreSQL database) as an ASGI callable, one
request at a time on uvloop, and counts this process's CPU time (`time.process_time`: every thread, so
the handler threads and psycopg's side of each statement too). The figure is the app's own work per
request: middleware, the request gate, FastAPI, the handler and its SQL client side. PostgreSQL's own
CPU is another process and is not counted; nor is HTTP parsing, which is the same for every route.

Cases, each `--requests` times a turn, after 50 unmeasured ones:

- `healthz`: `GET /healthz`, no token and no database (the floor any request pays);
- `heartbeat`: `POST /v1/jobs/{id}/measurements`, kind heartbeat, with the job's own token;
- `get`: `GET /v1/jobs/{id}` with a member token of the jobs' team;
- `list`: `GET /v1/jobs?status=RUNNING&limit=20` with that member token;
- `page2`: the same list's second page (`cursor` the id of its last job, as the first page gives it);
- `submit`: `POST /v1/jobs` with that member token, the seeded jobs' spec under a new name each time
  (so its plan comes from the planner's cache, as a resubmitted experiment's does).

The database holds `--jobs` RUNNING jobs (`heartbeats.seed`: a real plan each, a job token each).

`--against DIR` measures another checkout (`git worktree add DIR REV`, the same migration head) on the
same database: each turn runs each tree in a child process of its own, started in that tree with it
first on the import path, the order flipped every other turn; it prints both trees' medians and their
ratio.

    .venv/bin/python benchmarks/request_cpu.py [--jobs 1000] [--requests 1000] [--turns 3]
        [--postgres-url URL] [--against DIR]

It exits 0 whatever it measures: it is a measurement, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from side_by_side import add_against, machine_speed, postgres_server, trees

LIST_QUERY = b"status=RUNNING&limit=20"
CASES = ("healthz", "heartbeat", "get", "list", "page2", "submit")
WARM_UP = 50
HERE = Path(__file__).resolve().parent


def seed_database(url: str, n_jobs: int) -> dict[str, Any]:
    """`n_jobs` RUNNING jobs with their job tokens, and a member token of their team."""
    from heartbeats import TINY, seed

    from service.store.db import make_engine, make_sessionmaker
    from service.store.models import Team
    from service.store.tokens import create_token
    from service.store.vocab import Role

    job_tokens = seed(url, n_jobs)
    engine = make_engine(url)
    with make_sessionmaker(engine).begin() as session:
        team = session.query(Team).filter_by(name="bench").one()
        member = create_token(session, role=Role.MEMBER, team=team, name="bench-member")[1]
    engine.dispose()
    return {"jobs": [[job_id, token] for job_id, token in job_tokens.items()], "member": member, "spec": TINY}


def measure(url: str, seeded: dict[str, Any], requests: int) -> dict[str, float]:
    """CPU ms per request of each case, on this process's `service` (whichever tree it imports)."""
    import uvloop

    from service.api.app import create_app
    from service.settings import Settings

    jobs: list[list[Any]] = seeded["jobs"]
    member: str = seeded["member"]
    beat = json.dumps({"kind": "heartbeat", "data": {"step": 10, "loss": 2.5, "tokens_per_s": 4096.0}}).encode()
    spec: dict[str, Any] = seeded["spec"]
    pid = os.getpid()  # job names differ between the trees' children on one database
    with tempfile.TemporaryDirectory(prefix="shardctl-bench-") as data_dir:
        app = create_app(Settings(database_url=url, data_dir=Path(data_dir)))

        async def call(method: str, path: str, token: str | None = None, body: bytes = b"",
                       query: bytes = b"") -> int:
            headers = [(b"host", b"bench")]
            if token:
                headers.append((b"authorization", f"Bearer {token}".encode()))
            if body:
                headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
                     "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": query,
                     "root_path": "", "headers": headers, "client": ("127.0.0.1", 50000),
                     "server": ("127.0.0.1", 80)}
            sent = False

            async def receive() -> MutableMapping[str, Any]:
                nonlocal sent
                if not sent:
                    sent = True
                    return {"type": "http.request", "body": body, "more_body": False}
                await asyncio.Event().wait()  # the client never goes away
                raise AssertionError("unreachable")

            status: list[int] = []

            async def send(message: MutableMapping[str, Any]) -> None:
                if message["type"] == "http.response.start":
                    status.append(message["status"])

            await app(scope, receive, send)
            return status[0]

        page2 = f"status=RUNNING&limit=20&cursor={max(job_id for job_id, _ in jobs) - 20}".encode()

        def job(i: int) -> list[Any]:
            return jobs[i % len(jobs)]

        cases: dict[str, tuple[Callable[[int], Awaitable[int]], int]] = {
            "healthz": (lambda i: call("GET", "/healthz"), 200),
            "heartbeat": (lambda i: call("POST", f"/v1/jobs/{job(i)[0]}/measurements", job(i)[1], beat), 201),
            "get": (lambda i: call("GET", f"/v1/jobs/{job(i)[0]}", member), 200),
            "list": (lambda i: call("GET", "/v1/jobs", member, query=LIST_QUERY), 200),
            "page2": (lambda i: call("GET", "/v1/jobs", member, query=page2), 200),
            "submit": (lambda i: call("POST", "/v1/jobs", member,
                                      json.dumps({**spec, "name": f"submit-{pid}-{i}"}).encode()), 201),
        }

        async def run() -> dict[str, float]:
            figures = {}
            for name in CASES:
                request, expected = cases[name]
                for i in range(WARM_UP):
                    if (got := await request(i)) != expected:
                        raise SystemExit(f"{name}: answered {got}, expected {expected}")
                start = time.process_time()
                for i in range(requests):
                    await request(WARM_UP + i)
                figures[name] = (time.process_time() - start) * 1000 / requests
            return figures

        try:
            return uvloop.run(run())
        finally:
            app.state.engine.dispose()


def child(tree: Path | None, url: str, seeded_file: Path, requests: int) -> dict[str, float]:
    """`measure` in a fresh process running `tree`'s code (None: this tree)."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tree), env.get("PYTHONPATH", "")) if p)
    done = subprocess.run([sys.executable, str(HERE / "request_cpu.py"), "--measure", url, str(seeded_file),
                           str(requests)], env=env, cwd=tree, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the measurement of {tree or 'this tree'} failed:\n{done.stderr[-3000:]}")
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--measure"]:  # a child: measure and print one JSON line
        url, seeded_file, requests = argv[1], Path(argv[2]), int(argv[3])
        print(json.dumps(measure(url, json.loads(seeded_file.read_text()), requests)))
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--postgres-url", default=os.environ.get("SHARDCTL_TEST_POSTGRES_URL"))
    add_against(p, "each turn runs both trees, each in a child process of its own")
    args = p.parse_args(argv)
    measured_trees = trees(p, args.against)
    from scratch_db import scratch_database

    base = postgres_server(args.postgres_url)
    load = os.getloadavg()
    print(f"== CPU per request through the ASGI app in process: {args.jobs:,} running jobs, {args.requests:,}"
          f" requests a case a turn, {args.turns} turns; load average before: {load[0]:.2f} {load[1]:.2f}"
          f" {load[2]:.2f} on {os.cpu_count()} CPUs;"
          f" machine speed {machine_speed():.1f} ms"
          " (side_by_side.machine_speed: lower is faster)")
    with scratch_database(base, "request_cpu") as url, tempfile.TemporaryDirectory() as tmp:
        seeded_file = Path(tmp) / "seeded.json"
        seeded_file.write_text(json.dumps(seed_database(url, args.jobs)))
        turns: list[list[dict[str, float]]] = [[] for _ in measured_trees]
        for turn in range(args.turns):
            order = list(range(len(measured_trees)))
            if turn % 2:
                order.reverse()
            for i in order:
                turns[i].append(child(measured_trees[i], url, seeded_file, args.requests))
    medians = [{name: statistics.median(t[name] for t in tree_turns) for name in CASES} for tree_turns in turns]
    header = f"{'CPU ms per request':<22}{'this tree':>12}"
    if args.against is not None:
        header += f"{args.against!s:>22}{'ratio':>8}"
    print(header + "   this tree's turns")
    for name in CASES:
        line = f"{name:<22}{medians[0][name]:>12.3f}"
        if args.against is not None:
            line += f"{medians[1][name]:>22.3f}{medians[0][name] / medians[1][name]:>8.2f}"
        print(line + "   " + " ".join(f"{t[name]:.3f}" for t in turns[0]))
    for label, m in zip(("this tree", str(args.against)), medians, strict=False):
        print(f"{label}: beyond /healthz: heartbeat {m['heartbeat'] - m['healthz']:.3f} ms,"
              f" get {m['get'] - m['healthz']:.3f} ms, list {m['list'] - m['healthz']:.3f} ms,"
              f" submit {m['submit'] - m['healthz']:.3f} ms")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())};"
          f" machine speed {machine_speed():.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
