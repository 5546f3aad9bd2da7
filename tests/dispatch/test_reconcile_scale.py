"""A reconcile cycle's cost does not grow with the jobs it tracks: one sacct (and at most one squeue) for
every Slurm job, the same Kubernetes lists, and the same number of SQL statements at 10 and 1,000
tracked jobs while nothing changes; jobs that end are all recorded, several per transaction.

Slurm is the real `SlurmBackend` with a runner that answers sacct/squeue in their formats from a table;
Kubernetes is the real backend and client against the project's fake API server."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from kubernetes import client
from sqlalchemy import JSON, column, create_engine, event, insert, select, table
from sqlalchemy.engine import Engine

from service.store.db import make_engine, make_sessionmaker
from service.store.models import Attempt, Event, Job, Team
from tests.k8s.conftest import make_request
from tests.k8s.fake_apiserver import FakeApiServer
from tests.specs import tiny
from workers.backends.base import attempt_name
from workers.backends.kubernetes import KubernetesBackend
from workers.backends.slurm import SlurmBackend
from workers.backends.slurm.accounting import SACCT_FIELDS
from workers.dispatch.context import CycleReport, DispatcherConfig
from workers.dispatcher import Dispatcher

NS = "team-a"
SLURM_BASE = 500_000


class SlurmTable:
    """sacct and squeue as Slurm would answer them for the jobs in `jobs` (id -> name, state); counts calls."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.jobs: dict[str, tuple[str, str]] = {}
        self.calls: Counter[str] = Counter()

    def __call__(self, args: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        self.calls[args[0]] += 1
        lines = []
        if args[0] == "sacct":
            for job_id in args[args.index("-j") + 1].split(","):
                name, state = self.jobs[job_id]
                rec = {"JobIDRaw": job_id, "JobName": name, "State": state, "ExitCode": "0:0", "NodeList": "node1",
                       "Reason": "None", "WorkDir": str(self.folder / name), "NNodes": "1"}
                lines.append("|".join(rec[f] for f in SACCT_FIELDS))
        elif args[0] == "squeue":
            names = set(args[args.index("-n") + 1].split(","))
            lines = [f"{i}|{n}|{s}|node1|None|{self.folder / n}|1|N/A" for i, (n, s) in self.jobs.items()
                     if n in names and s == "RUNNING"]
        return subprocess.CompletedProcess(args, 0, stdout="\n".join(lines) + "\n", stderr="")


def running_jobset(fake: FakeApiServer, api: Any, job_ids: list[int]) -> dict[int, str]:
    """One running JobSet and pod per job: the first submitted through the backend (validated by the
    server), the others copies of it under their own names. Returns job id -> pod name."""
    template = attempt_name(job_ids[0], 1)
    KubernetesBackend(api, namespace=NS, default_image="img:1").submit(
        make_request(job_ids[0], 1, nodes=1, procs=1, gpus_per_proc=0))
    pod = fake.make_pods("jobsets", NS, template)[0]
    fake.set_pod(NS, pod, phase="Running", node="k8s-node-1")
    docs = {plural: json.dumps(fake.objects[(plural, NS, name)]) for plural, name in (("jobsets", template),
                                                                                      ("pods", pod))}
    pods = {job_ids[0]: pod}
    for job_id in job_ids[1:]:
        name = attempt_name(job_id, 1)
        for plural, doc in docs.items():
            obj = json.loads(doc.replace(f'{template}"', f'{name}"').replace(f"{template}-", f"{name}-"))
            fake.objects[(plural, NS, obj["metadata"]["name"])] = obj
            if plural == "pods":
                pods[job_id] = obj["metadata"]["name"]
    return pods


def seed(url: str, first_id: int, slurm: int, kube: int) -> tuple[list[int], list[int]]:
    """RUNNING jobs with a running attempt each, recorded as the backends will report them."""
    engine = create_engine(url)
    started = datetime.now(UTC) - timedelta(hours=1)
    with engine.begin() as conn:
        team = conn.execute(select(Team.id).where(Team.name == "bench")).scalar()
        if team is None:
            team = conn.execute(insert(Team).values(name="bench", created_at=started).returning(Team.id)).scalar_one()
        jobs = table("jobs", *(column(c.name) for c in Job.__table__.columns if c.name not in ("spec", "plan")),
                     column("spec", JSON()), column("plan", JSON()))
        attempts = table("attempts", *(column(c.name) for c in Attempt.__table__.columns
                                       if c.name not in ("id", "nodes")), column("nodes", JSON()))
        plan = json.loads(make_request().job.plan.model_dump_json())
        slurm_ids = list(range(first_id, first_id + slurm))
        kube_ids = list(range(first_id + slurm, first_id + slurm + kube))
        job_rows, attempt_rows = [], []
        for kind, ids, nodes in (("slurm", slurm_ids, ["node1"]), ("kubernetes", kube_ids, ["k8s-node-1"])):
            for job_id in ids:
                name = attempt_name(job_id, 1)
                job_rows.append({"id": job_id, "name": f"j{job_id}", "team_id": team, "status": "RUNNING",
                                 "backend": kind, "priority": 0, "spec": tiny(backend={"kind": kind}), "plan": plan,
                                 "layout": "", "predicted_step_s": None, "created_by": "test", "created_at": started,
                                 "updated_at": started, "finished_at": None, "lease_owner": None,
                                 "lease_expires_at": None, "gpu": "cpu", "gpus": 1, "pool": None,
                                 "admitted_at": started, "predicted_s": None})
                backend_id = str(SLURM_BASE + job_id) if kind == "slurm" else f"jobset/{NS}/{name}"
                attempt_rows.append({"job_id": job_id, "number": 1, "backend_name": name, "nodes": nodes,
                                     "backend_id": backend_id,
                                     "status": "RUNNING", "exit_code": None, "exit_reason": None,
                                     "created_at": started, "finished_at": None, "failure": None, "log_tail": None,
                                     "started_at": started})
        conn.execute(insert(jobs), job_rows)
        conn.execute(insert(attempts), attempt_rows)
    engine.dispose()
    return slurm_ids, kube_ids


def statements(engine: Engine) -> list[int]:
    counter = [0]

    def count(*_: Any) -> None:
        counter[0] += 1

    event.listen(engine, "before_cursor_execute", count)
    return counter


def test_a_cycle_costs_the_same_backend_calls_and_sql_at_10_and_1000_jobs(db_url: str, fake: FakeApiServer,
                                                                          tmp_path: Path) -> None:
    engine = make_engine(db_url)
    sessions = make_sessionmaker(engine)
    sql = statements(engine)
    slurm_table = SlurmTable(tmp_path / "slurm")
    with client.ApiClient(client.Configuration(host=fake.host)) as api:
        kube = KubernetesBackend(api, namespace=NS, default_image="img:1")
        dispatcher = Dispatcher(sessions, {"slurm": SlurmBackend(tmp_path / "slurm", runner=slurm_table),
                                           "kubernetes": kube}, DispatcherConfig(owner="scale-test"))
        per_size: dict[int, tuple[Counter[str], int, int]] = {}
        next_id, pods, slurm_all = 1, {}, []
        for size in (10, 1000):
            add = size - len(slurm_all) - len(pods)
            slurm_ids, kube_ids = seed(db_url, next_id, add // 2, add - add // 2)
            next_id += add
            slurm_all += slurm_ids
            for job_id in slurm_ids:
                slurm_table.jobs[str(SLURM_BASE + job_id)] = (attempt_name(job_id, 1), "RUNNING")
            pods.update(running_jobset(fake, api, kube_ids))
            dispatcher.run_once()  # discovery, and anything new recorded once
            slurm_table.calls.clear()
            fake.reset_requests()
            sql[0] = 0
            report = CycleReport()
            dispatcher.reconcile(report)  # the cycle's reconcile step (leasing and the queue view aside)
            per_size[size] = (Counter(slurm_table.calls), len(fake.requests), sql[0])
            assert report.transitions == 0
        assert per_size[10][0] == per_size[1000][0] == Counter({"sacct": 1, "squeue": 1})
        assert per_size[10][1] == per_size[1000][1] == 2  # one JobSet list, one pod list
        assert per_size[10][2] == per_size[1000][2]

        # ends are all recorded: 300 Slurm jobs complete, 5 pods succeed, in one cycle
        done = slurm_all[:300]
        for job_id in done:
            slurm_table.jobs[str(SLURM_BASE + job_id)] = (attempt_name(job_id, 1), "COMPLETED")
        finished_pods = list(pods.items())[:5]
        for job_id, pod in finished_pods:
            fake.set_pod(NS, pod, phase="Succeeded", exit_code=0)
            fake.set_condition("jobsets", NS, attempt_name(job_id, 1), "Completed")
        report = CycleReport()
        dispatcher.reconcile(report)
        assert report.transitions == 305
    with sessions.begin() as session:
        ended = set(session.scalars(select(Job.id).where(Job.status == "SUCCEEDED")))
        assert ended == set(done) | {job_id for job_id, _ in finished_pods}
        kinds = Counter(session.scalars(select(Event.kind).where(Event.job_id.in_(ended))))
        assert kinds == Counter({"job.succeeded": 305})
    engine.dispose()
