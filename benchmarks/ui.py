"""Server time of the dashboard's Jobs page (`/ui/jobs`) with 100,000 jobs in PostgreSQL, next to its
goal and next to the same query through the JSON API (`GET /v1/jobs`), in one run.

It creates its own database `shardctl_bench_ui_<random>` on the server of `--postgres-url` (dropped
at the end, also on errors), migrates it, bulk-inserts the jobs with one SQLAlchemy Core insert per
5,000 rows (four teams, six statuses, three backends, the spec and plan of a real `plan()` of the
`llama-tiny` spec), mints an admin token, and serves the API app with its dashboard in this process.

Cases, each as the admin: the first page, the tenth page (the cursor the ninth page links to), a
filtered page (`status=QUEUED&team=alpha&gpu=cpu`), and a sorted one (`sort=-gpus&team=alpha`: most
GPUs first within a team, on the `(team_id, gpus, id)` index), first and tenth page. GPU counts are
drawn from 1 to 16 with their own random stream, so the other columns are as before sorting came.
A request is timed from the ASGI call to the last byte of the response, in process (Starlette's
TestClient: no socket, no client work), `--runs` times per case after a warm-up, UI and API requests
interleaved so both see the same machine. It prints the p50 and p99 of each next to the goal (the
page's p99 under 50 ms) and the API's figures, the page's p99 over the API's, and the load average
before and after. Run it on a quiet machine: the figures are wall time.

    .venv/bin/python benchmarks/ui.py [--jobs 100000] [--runs 200] [--postgres-url URL]

It exits 0 whether or not the goal is met: it is a measurement, not a test.
"""

from __future__ import annotations

import argparse
import html
import os
import random
import re
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from scratch_db import scratch_database
from sqlalchemy import JSON, column, create_engine, insert, table, text

from service.api.app import create_app
from service.api.ui.session import COOKIE
from service.planner import plan
from service.settings import Settings
from service.spec import TrainingSpec
from service.store.db import make_sessionmaker
from service.store.models import Event, Job, Team
from service.store.tokens import create_token
from service.store.vocab import Role

DEFAULT_URL = "postgresql+psycopg://shardctl:shardctl@127.0.0.1:5432/shardctl"
GOAL_P99_MS = 50.0
TEAMS = ("alpha", "beta", "gamma", "delta")
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
FILTER = "status=QUEUED&team=alpha&gpu=cpu"
SORTED = "sort=-gpus&team=alpha"
GPU_COUNTS = (1, 2, 4, 8, 16)


def seed(url: str, n_jobs: int, rng: random.Random, gpu_rng: random.Random) -> tuple[str, float]:
    """Bulk-insert `n_jobs` jobs (ids 1..n) and one event each; returns an admin token and the seconds taken."""
    start = time.perf_counter()
    planned = plan(TrainingSpec.model_validate(TINY))
    plan_doc = planned.model_dump(mode="json")
    engine = create_engine(url)
    with engine.begin() as conn:
        team_ids = {t: int(conn.execute(insert(Team).values(name=t, created_at=datetime.now(UTC))
                                        .returning(Team.id)).scalar_one()) for t in TEAMS}
    specs = {(t, b): TrainingSpec.model_validate({**TINY, "team": t, "backend": {"kind": b}}).model_dump(mode="json")
             for t in TEAMS for b in BACKENDS}
    # The documents are JSON already: insert them past the typed columns, which would re-validate each row.
    rows = table("jobs", *(column(c.name) for c in Job.__table__.columns if c.name not in ("spec", "plan")),
                 column("spec", JSON()), column("plan", JSON()))
    t0 = datetime.now(UTC) - timedelta(seconds=n_jobs * 30)
    layout = planned.layout.short()
    for lo in range(1, n_jobs + 1, BATCH):
        hi = min(lo + BATCH, n_jobs + 1)
        jobs, events = [], []
        for job_id in range(lo, hi):
            team = rng.choice(TEAMS)
            backend = rng.choices(list(BACKENDS), weights=list(BACKENDS.values()))[0]
            status = rng.choices(list(STATUSES), weights=list(STATUSES.values()))[0]
            created = t0 + timedelta(seconds=job_id * 30)
            updated = created + timedelta(seconds=rng.randint(1, 7200))
            jobs.append({"id": job_id, "name": f"run-{team}-{job_id % 977}", "team_id": team_ids[team],
                         "status": status, "backend": backend, "priority": rng.choice((0, 0, 0, 10, 100)),
                         "spec": specs[(team, backend)], "plan": plan_doc, "created_by": "admin:seed",
                         "layout": layout, "predicted_step_s": planned.time.step_s, "created_at": created,
                         "updated_at": updated, "finished_at": updated if status in TERMINAL else None,
                         "lease_owner": None, "lease_expires_at": None, "gpu": "cpu",
                         "gpus": gpu_rng.choice(GPU_COUNTS), "pool": None,
                         "admitted_at": None if status == "QUEUED" else created, "predicted_s": 4.0})
            events.append({"job_id": job_id, "at": created, "actor": "admin:seed", "kind": "job.queued",
                           "message": "planned and queued", "data": {}})
        with engine.begin() as conn:
            conn.execute(insert(rows), jobs)
            conn.execute(insert(Event), events)
    with engine.begin() as conn:
        conn.execute(text("SELECT setval(pg_get_serial_sequence('jobs', 'id'), :n)"), {"n": max(n_jobs, 1)})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))
    with make_sessionmaker(engine).begin() as session:
        _, token = create_token(session, role=Role.ADMIN, name="bench admin")
    engine.dispose()
    return token, time.perf_counter() - start


def _get(client: TestClient, path: str, headers: dict[str, str]) -> tuple[float, str]:
    started = time.perf_counter()
    answer = client.get(path, headers=headers)
    took = (time.perf_counter() - started) * 1000
    if answer.status_code != 200:
        raise SystemExit(f"GET {path}: {answer.status_code} {answer.text[:300]}")
    return took, answer.text


def tenth_page_paths(client: TestClient, ui: dict[str, str], api: dict[str, str],
                     query: str = "") -> tuple[str, str]:
    """The tenth page's URL of each under `query`: the cursor the ninth page hands out, followed from the first."""
    ui_path, api_path = "/ui/jobs" + (f"?{query}" if query else ""), f"/v1/jobs?limit=50{'&' if query else ''}{query}"
    for _ in range(9):
        _, page = _get(client, ui_path, ui)
        found = re.search(r'href="(/ui/jobs\?[^"]*cursor=[^"]+)" rel="next"', page)
        if found is None:
            raise SystemExit("the Jobs page has no 'Next page' link; fewer than ten pages of jobs?")
        ui_path = html.unescape(found.group(1))
        _, body = _get(client, api_path, api)
        cursor = re.search(r'"next_cursor":"([^"]+)"', body)
        if cursor is None:
            raise SystemExit("GET /v1/jobs has no next_cursor")
        api_path = f"/v1/jobs?limit=50{'&' if query else ''}{query}&cursor={cursor.group(1)}"
    return ui_path, api_path


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=200, help="timed requests per case and side")
    parser.add_argument("--postgres-url", default=os.environ.get("SHARDCTL_TEST_POSTGRES_URL", DEFAULT_URL),
                        help="a PostgreSQL URL whose role may CREATE DATABASE")
    args = parser.parse_args()
    rng, gpu_rng = random.Random(14), random.Random(15)
    with (tempfile.TemporaryDirectory(prefix="shardctl-bench-ui-") as tmp,
          scratch_database(args.postgres_url, "ui") as url):
        token, seconds = seed(url, args.jobs, rng, gpu_rng)
        print(f"seeded {args.jobs:,} jobs in {seconds:.1f} s (bulk Core inserts of {BATCH:,})")
        app = create_app(Settings(database_url=url, data_dir=Path(tmp)))
        ui = {"Cookie": f"{COOKIE}={token}"}
        api = {"Authorization": f"Bearer {token}"}
        with TestClient(app) as client:
            tenth_ui, tenth_api = tenth_page_paths(client, ui, api)
            sorted_ui, sorted_api = tenth_page_paths(client, ui, api, SORTED)
            cases = [("first page", "/ui/jobs", "/v1/jobs?limit=50"),
                     ("tenth page", tenth_ui, tenth_api),
                     (f"filtered ({FILTER})", f"/ui/jobs?{FILTER}", f"/v1/jobs?limit=50&{FILTER}"),
                     (f"sorted ({SORTED})", f"/ui/jobs?{SORTED}", f"/v1/jobs?limit=50&{SORTED}"),
                     ("sorted, tenth page", sorted_ui, sorted_api)]
            print(f"load average before timing: {_load()}")
            print(f"{args.runs} requests per case and side, in process (ASGI call to last byte), ms\n")
            print(f"{'case':<44} {'page p50':>9} {'page p99':>9} {'goal p99':>9} {'met':>4}"
                  f" {'API p50':>8} {'API p99':>8} {'page/API':>9}")
            for label, ui_path, api_path in cases:
                for _ in range(5):  # warm-up: connections, caches, templates
                    _get(client, ui_path, ui)
                    _get(client, api_path, api)
                page_ms, api_ms = [], []
                for _ in range(args.runs):
                    page_ms.append(_get(client, ui_path, ui)[0])
                    api_ms.append(_get(client, api_path, api)[0])
                page99, api99 = p(page_ms, 0.99), p(api_ms, 0.99)
                print(f"{label:<44} {statistics.median(page_ms):>9.1f} {page99:>9.1f} {GOAL_P99_MS:>9.0f}"
                      f" {'yes' if page99 < GOAL_P99_MS else 'no':>4} {statistics.median(api_ms):>8.1f}"
                      f" {api99:>8.1f} {page99 / api99:>8.2f}x")
            print(f"\nload average after timing: {_load()}")


def _load() -> str:
    """The 1, 5 and 15 minute load averages: the background the wall times were taken against."""
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
