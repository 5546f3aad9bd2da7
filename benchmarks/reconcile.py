"""One dispatcher cycle with 10,000 tracked jobs across the three backends, in PostgreSQL.

It creates its own database `shardctl_bench_reconcile_<random>` on the server of `--postgres-url`
(`scratch_db.scratch_database`: migrated, dropped at the end, also on errors) and bulk-inserts the
tracked jobs (RUNNING, with their first attempt) split across the backends (`--slurm`,
`--kubernetes`, `--local`). Each backend is the real backend class; only what it talks to is stood in for:

- Slurm: the real `SlurmBackend` with a `runner` that answers `sacct` and `squeue` in their own
  formats (`-P` lines of `SACCT_FIELDS`, `SQUEUE_FORMAT`) from a table of the jobs' states, and counts
  every call;
- Kubernetes: the real `KubernetesBackend` and `kubernetes` client against the project's
  schema-validating fake API server (`tests/k8s/fake_apiserver.py`), run in its own process so its work
  is not billed to the dispatcher's CPU time. One attempt is submitted through the backend (validated by
  the server), its JobSet and pod are cloned per job with the names changed; requests are counted by
  the server;
- local: the real `LocalBackend` over attempt folders as its supervisor writes them (`request.json`,
  `state.json` naming a live pid).

Cycles: the first (a fresh dispatcher, nothing remembered) and `--cycles` more in which `--changes`
jobs per backend end (Slurm COMPLETED, pods Succeeded, local exit files), so every cycle writes some
transitions. Per cycle: wall and CPU seconds of `Dispatcher.run_once` (which leases nothing: every
job is tracked), of `reconcile` alone, backend calls, and SQL statements sent (round trips). CPU is
`time.process_time` of this process: the fake API server and PostgreSQL are other processes.

    .venv/bin/python benchmarks/reconcile.py [--slurm 5000] [--kubernetes 4800] [--local 200]
        [--cycles 3] [--changes 20] [--postgres-url URL] [--profile FILE]

Goal: one cycle under 1 s with 10,000 tracked jobs; one sacct (and at most one squeue) per cycle, one
list per Kubernetes kind plus one pod list. It exits 0 whether or not the goal is met.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import json
import multiprocessing
import os
import pstats
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from scratch_db import scratch_database
from sqlalchemy import JSON, Engine, column, create_engine, event, insert, table, text

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.k8s: the fake API server

from service.planner import Plan, plan
from service.spec import TrainingSpec
from service.store.db import make_engine, make_sessionmaker
from service.store.models import Attempt, Job, Team
from workers.backends.base import Backend, attempt_name
from workers.backends.local import LocalBackend
from workers.backends.slurm import SlurmBackend
from workers.backends.slurm.accounting import SACCT_FIELDS
from workers.dispatch.context import CycleReport, DispatcherConfig
from workers.dispatch.request import build_request
from workers.dispatcher import Dispatcher

TINY: dict[str, Any] = {"name": "bench", "model": {"preset": "llama-tiny"},
                        "training": {"global_batch": 2, "precision": "fp32", "steps": 1},
                        "resources": {"gpu": "cpu", "gpus_per_node": 1, "nodes": 1}}
NS = "team-a"
BATCH = 5000
GOAL_S = 1.0


# -- Slurm: sacct and squeue answered from a table, in their formats --------------------------------

class SlurmTable:
    """What the Slurm controller and accounting would say about our jobs; a `runner` for SlurmBackend.
    Each job's `sacct` and `squeue` lines are rendered when it is `set` (outside the timed cycle): the
    real commands run in processes of their own, so making their output is not the dispatcher's CPU."""

    def __init__(self, backend_folder: Path) -> None:
        self.folder = backend_folder
        self.jobs: dict[str, tuple[str, str, str]] = {}  # slurm id -> (name, state, exit code)
        self._lines: dict[str, tuple[str, str]] = {}  # slurm id -> (its sacct line, its squeue line)
        self.calls: Counter[str] = Counter()

    def set(self, job_id: str, name: str, state: str, code: str) -> None:
        self.jobs[job_id] = (name, state, code)
        self._lines[job_id] = (self._line(job_id, squeue=False), self._line(job_id, squeue=True))

    def _line(self, job_id: str, *, squeue: bool) -> str:
        name, state, code = self.jobs[job_id]
        workdir = str(self.folder / name)
        node = f"node{int(job_id) % 4 + 1}"
        if squeue:  # SQUEUE_FORMAT: id|name|state|nodes|reason|workdir|count|start
            return f"{job_id}|{name}|{state}|{node}|None|{workdir}|1|2026-12-01T10:00:00"
        fields = {"JobIDRaw": job_id, "JobName": name, "State": state, "ExitCode": code, "NodeList": node,
                  "Reason": "None", "WorkDir": workdir, "NNodes": "1"}
        return "|".join(fields[f] for f in SACCT_FIELDS)

    def __call__(self, args: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        self.calls[args[0]] += 1
        if args[0] == "sacct":
            ids = args[args.index("-j") + 1].split(",")
            out = "\n".join(self._lines[i][0] for i in ids if i in self._lines)
        elif args[0] == "squeue":
            names = set(args[args.index("-n") + 1].split(","))
            out = "\n".join(self._lines[i][1] for i, (n, state, _) in self.jobs.items()
                            if n in names and state in ("RUNNING", "PENDING"))
        else:
            out = ""
        return subprocess.CompletedProcess(args, 0, stdout=out + "\n", stderr="")


# -- Kubernetes: the fake API server in its own process ----------------------------------------------

def _serve_fake(job_ids: list[int], conn: Any) -> None:
    """Child process: a fake API server holding one running JobSet (and its pod) per job id. Answers
    `count` (requests since the last `reset`), `finish <id>...` and `stop` over `conn`."""
    from kubernetes import client

    from workers.backends.kubernetes import KubernetesBackend

    # by name: the test helpers are not type-checked with the benchmarks
    make_request = importlib.import_module("tests.k8s.conftest").make_request
    fake = importlib.import_module("tests.k8s.fake_apiserver").FakeApiServer().start()
    with client.ApiClient(client.Configuration(host=fake.host)) as api:
        backend = KubernetesBackend(api, namespace=NS, default_image="ghcr.io/shardctl/runtime:0.1.0")
        template = attempt_name(job_ids[0], 1)
        backend.submit(make_request(job_ids[0], 1, nodes=1, procs=1, gpus_per_proc=0, team="bench"))
    pod = fake.make_pods("jobsets", NS, template)[0]
    fake.set_pod(NS, pod, phase="Running", node="k8s-node-1")
    jobset_doc = json.dumps(fake.objects[("jobsets", NS, template)])
    pod_doc = json.dumps(fake.objects[("pods", NS, pod)])
    pods: dict[int, str] = {job_ids[0]: pod}
    for job_id in job_ids[1:]:
        name = attempt_name(job_id, 1)
        # the names end in "-1": replace the whole name wherever it is followed by a quote or a dash
        for plural, doc in (("jobsets", jobset_doc), ("pods", pod_doc)):
            obj = json.loads(doc.replace(f'{template}"', f'{name}"').replace(f"{template}-", f"{name}-"))
            fake.objects[(plural, NS, obj["metadata"]["name"])] = obj
            if plural == "pods":
                pods[job_id] = obj["metadata"]["name"]
    fake.reset_requests()
    conn.send(fake.host)
    while True:
        cmd, *args = conn.recv()
        if cmd == "count":
            conn.send(len(fake.requests))
            fake.reset_requests()
        elif cmd == "finish":
            for job_id in args:
                fake.set_pod(NS, pods[job_id], phase="Succeeded", exit_code=0)
                fake.set_condition("jobsets", NS, attempt_name(job_id, 1), "Completed")
            conn.send(len(args))
        elif cmd == "stop":
            fake.go_down()
            conn.send("stopped")
            return


# -- seeding -------------------------------------------------------------------------------------

def seed(url: str, counts: dict[str, int], planned: Plan) -> dict[str, list[int]]:
    """Bulk-insert RUNNING jobs with one RUNNING attempt each; returns the job ids per backend."""
    engine = create_engine(url)
    with engine.begin() as conn:
        team_id = int(conn.execute(insert(Team).values(name="bench", created_at=datetime.now(UTC))
                                   .returning(Team.id)).scalar_one())
    rows = table("jobs", *(column(c.name) for c in Job.__table__.columns if c.name not in ("spec", "plan")),
                 column("spec", JSON()), column("plan", JSON()))
    attempt_rows = table("attempts", *(column(c.name) for c in Attempt.__table__.columns
                                       if c.name not in ("id", "nodes")), column("nodes", JSON()))
    plan_doc = planned.model_dump(mode="json")
    started = datetime.now(UTC) - timedelta(hours=1)
    ids: dict[str, list[int]] = {}
    next_id = 1
    jobs: list[dict[str, Any]] = []
    attempts: list[dict[str, Any]] = []
    for kind, n in counts.items():
        spec = TrainingSpec.model_validate({**TINY, "team": "bench", "backend": {"kind": kind}}).model_dump(mode="json")
        ids[kind] = list(range(next_id, next_id + n))
        for job_id in ids[kind]:
            jobs.append({"id": job_id, "name": f"bench-{kind}-{job_id}", "team_id": team_id, "status": "RUNNING",
                         "backend": kind, "priority": 0, "spec": spec, "plan": plan_doc, "layout": "dp1",
                         "predicted_step_s": 1.0, "created_by": "admin:seed", "created_at": started,
                         "updated_at": started, "finished_at": None, "lease_owner": None, "lease_expires_at": None,
                         "gpu": "cpu", "gpus": 1, "pool": None, "admitted_at": started, "predicted_s": 3600.0})
            name = attempt_name(job_id, 1)
            backend_id = {"slurm": str(100000 + job_id), "kubernetes": f"jobset/{NS}/{name}", "local": name}[kind]
            attempts.append({"job_id": job_id, "number": 1, "backend_name": name, "backend_id": backend_id,
                             "nodes": [], "status": "RUNNING", "exit_code": None, "exit_reason": None,
                             "created_at": started, "finished_at": None, "failure": None, "log_tail": None,
                             "started_at": started})
        next_id += n
    with engine.begin() as conn:
        for lo in range(0, len(jobs), BATCH):
            conn.execute(insert(rows), jobs[lo:lo + BATCH])
            conn.execute(insert(attempt_rows), attempts[lo:lo + BATCH])
        conn.execute(text("SELECT setval(pg_get_serial_sequence('jobs', 'id'), :n)"), {"n": next_id})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))
    engine.dispose()
    return ids


def local_folders(backend: LocalBackend, job_ids: list[int], planned: Plan) -> None:
    """Attempt folders as the local supervisor leaves them for a running attempt."""
    spec = TrainingSpec.model_validate({**TINY, "backend": {"kind": "local"}})
    for job_id in job_ids:
        req = build_request(job_id, 1, plan=planned, spec=spec, team="bench", token=None, api_url=None)
        folder = backend.folder / req.name
        folder.mkdir(parents=True)
        (folder / "request.json").write_text(req.model_dump_json())
        (folder / "state.json").write_text(json.dumps({"pid": os.getpid()}))


def finish_local(backend: LocalBackend, job_ids: list[int]) -> None:
    for job_id in job_ids:
        (backend.folder / attempt_name(job_id, 1) / "exit.json").write_text(json.dumps({"exit_code": 0}))


# -- measuring -----------------------------------------------------------------------------------

class Statements:
    """Counts the SQL statements an engine sends (each one a round trip to PostgreSQL)."""

    def __init__(self, engine: Engine) -> None:
        self.n = 0
        event.listen(engine, "before_cursor_execute", self._count)

    def _count(self, *_: Any) -> None:
        self.n += 1


class PollTimes:
    """Wall and CPU seconds each backend's `poll` took (the backend's share of the cycle)."""

    def __init__(self, backends: dict[str, Backend]) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(backends, 0.0)
        self.cpu: dict[str, float] = dict.fromkeys(backends, 0.0)
        for name, backend in backends.items():
            setattr(backend, "poll", self._wrap(name, backend.poll))  # noqa: B010 (an instance attribute)

    def _wrap(self, name: str, poll: Callable[..., Any]) -> Callable[..., Any]:
        def timed_poll(*args: Any, **kw: Any) -> Any:
            start, cpu = time.perf_counter(), time.process_time()
            try:
                return poll(*args, **kw)
            finally:
                self.seconds[name] += time.perf_counter() - start
                self.cpu[name] += time.process_time() - cpu
        return timed_poll


def timed(fn: Callable[[], CycleReport | None]) -> tuple[float, float, CycleReport | None]:
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--slurm", type=int, default=5000)
    p.add_argument("--kubernetes", type=int, default=4800)
    p.add_argument("--local", type=int, default=200)
    p.add_argument("--cycles", type=int, default=3)
    p.add_argument("--changes", type=int, default=20, help="jobs per backend that end before each later cycle")
    p.add_argument("--postgres-url", default=os.environ.get("SHARDCTL_TEST_POSTGRES_URL"))
    p.add_argument("--profile", type=Path, help="write a cProfile summary (CPU time) of the steady cycles here")
    args = p.parse_args(argv)
    base = args.postgres_url or subprocess.run(["bash", "deploy/postgres.sh"], capture_output=True, text=True,
                                               check=True).stdout.strip()
    counts = {"slurm": args.slurm, "kubernetes": args.kubernetes, "local": args.local}
    planned = plan(TrainingSpec.model_validate(TINY))
    load = os.getloadavg()
    split = ", ".join(f"{k} {v:,}" for k, v in counts.items())
    print(f"== one dispatcher cycle, {sum(counts.values()):,} tracked jobs ({split}), PostgreSQL;"
          f" load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")
    with scratch_database(base, "reconcile") as url, tempfile.TemporaryDirectory(prefix="shardctl-bench-") as tmp:
        ids = seed(url, counts, planned)
        slurm_table = SlurmTable(Path(tmp) / "slurm")
        slurm = SlurmBackend(Path(tmp) / "slurm", runner=slurm_table)
        for job_id in ids["slurm"]:
            slurm_table.set(str(100000 + job_id), attempt_name(job_id, 1), "RUNNING", "0:0")
        local = LocalBackend(Path(tmp) / "local")
        local_folders(local, ids["local"], planned)
        parent, child = multiprocessing.get_context("spawn").Pipe()
        server = multiprocessing.get_context("spawn").Process(target=_serve_fake, args=(ids["kubernetes"], child),
                                                              daemon=True)
        server.start()
        host = parent.recv()
        from kubernetes import client

        from workers.backends.kubernetes import KubernetesBackend

        with client.ApiClient(client.Configuration(host=host)) as api:
            kube = KubernetesBackend(api, namespace=NS, default_image="ghcr.io/shardctl/runtime:0.1.0")
            backends: dict[str, Backend] = {"slurm": slurm, "kubernetes": kube, "local": local}
            sessions = make_sessionmaker(make_engine(url))
            statements = Statements(sessions.kw["bind"])
            polls = PollTimes(backends)
            dispatcher = Dispatcher(sessions, backends, DispatcherConfig(owner="bench"))
            profiler = cProfile.Profile(time.process_time) if args.profile else None  # CPU, as the figures
            print(f"{'cycle':<8} {'ended':>5} {'wall s':>7} {'cpu s':>6} {'reconcile wall/cpu s':>21} {'SQL':>6}"
                  f" {'sacct':>5} {'squeue':>6} {'k8s req':>7} {'transitions':>11}  poll wall/cpu s ("
                  f"{' '.join(counts)})")
            finished = {k: 0 for k in counts}
            for cycle in range(args.cycles + 1):
                ended = 0
                if cycle:
                    for kind, job_ids in ids.items():
                        batch = job_ids[finished[kind]:finished[kind] + args.changes]
                        finished[kind] += len(batch)
                        ended += len(batch)
                        if kind == "slurm":
                            for job_id in batch:
                                slurm_table.set(str(100000 + job_id), attempt_name(job_id, 1), "COMPLETED", "0:0")
                        elif kind == "local":
                            finish_local(local, batch)
                        elif batch:
                            parent.send(("finish", *batch))
                            parent.recv()
                parent.send(("count",))
                parent.recv()
                slurm_table.calls.clear()
                statements.n = 0
                polls.seconds, polls.cpu = dict.fromkeys(polls.seconds, 0.0), dict.fromkeys(polls.cpu, 0.0)
                if profiler is not None and cycle:
                    profiler.enable()
                wall, cpu, cycle_report = timed(dispatcher.run_once)
                sql = statements.n
                poll_s = " ".join(f"{polls.seconds[k]:.3f}/{polls.cpu[k]:.3f}" for k in counts)
                calls = dict(slurm_table.calls)
                parent.send(("count",))
                k8s_requests = parent.recv()
                # reconcile alone, right after (nothing new to apply): the steady-state share of the cycle
                r_wall, r_cpu, _ = timed(lambda: dispatcher.reconcile(CycleReport()))
                if profiler is not None and cycle:
                    profiler.disable()
                parent.send(("count",))
                parent.recv()
                label = "first" if cycle == 0 else f"next {cycle}"
                print(f"{label:<8} {ended:>5} {wall:>7.3f} {cpu:>6.3f} {r_wall:>10.3f}/{r_cpu:<10.3f} {sql:>6}"
                      f" {calls.get('sacct', 0):>5} {calls.get('squeue', 0):>6} {k8s_requests:>7}"
                      f" {cycle_report.transitions if cycle_report else 0:>11}  {poll_s}")
            parent.send(("stop",))
            parent.recv()
        server.join(10)
        if profiler is not None:
            with args.profile.open("w") as out:
                pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(60)
            print(f"profile of the later cycles: {args.profile}")
        print(f"goal: a cycle under {GOAL_S:.1f} s with 10,000 tracked jobs; one sacct (+ at most one squeue) and"
              f" one list per Kubernetes kind + one pod list per cycle (the k8s column counts HTTP requests,"
              f" discovery included on the first)")
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; host {socket.gethostname()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
