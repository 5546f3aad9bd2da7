"""Admission in the dispatcher's lease, against real databases: only admitted jobs are
leased, in the engine's order, and two dispatchers on PostgreSQL never admit past a pool's size."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from sqlalchemy import select

from service.scheduling import engine
from service.scheduling.snapshot import build_snapshot
from service.store.db import make_engine, make_sessionmaker
from service.store.models import Job
from tests.db_fixtures import Env
from tests.specs import tiny
from workers.backends.local import LocalBackend
from workers.dispatch.context import DispatcherConfig
from workers.dispatcher import Dispatcher


def job(env: Env, admin: dict[str, str], *, team: str = "default", priority: int = 0, slots: int = 1) -> int:
    spec = tiny(name=f"j-{team}-{priority}", team=team, priority=priority, resources={"gpus_per_node": slots},
                entrypoint={"command": ["python", "-c", "pass"]})
    r = env.client.post("/v1/jobs", json=spec, headers=admin)
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def pool(env: Env, admin: dict[str, str], gpus: int) -> None:
    r = env.client.put("/v1/pools/local", json={"backend": "local", "gpu": "cpu", "gpus": gpus}, headers=admin)
    assert r.status_code in (200, 201), r.text


def dispatcher(env: Env, folder: Path, owner: str = "d1") -> Dispatcher:
    return Dispatcher(make_sessionmaker(make_engine(env.url)), {"local": LocalBackend(folder)},
                      DispatcherConfig(owner=owner))


def held(env: Env) -> dict[int, Any]:
    with env.app.state.sessions.begin() as session:
        return {i: (p, g) for i, p, g in session.execute(select(Job.id, Job.pool, Job.gpus).where(
            Job.pool.is_not(None)))}


def test_only_admitted_jobs_are_leased_in_admission_order(env: Env, admin: dict[str, str], tmp_path: Path) -> None:
    pool(env, admin, 2)
    for team in ("alpha", "beta"):
        env.token("member", team=team)
    low1 = job(env, admin, team="alpha")
    low2 = job(env, admin, team="beta")
    high = job(env, admin, team="beta", priority=5)
    with env.app.state.sessions.begin() as session:  # the same store gives the same decision
        snap = build_snapshot(session)
        first, second = (engine.admit(build_snapshot(session)) for _ in range(2))
    assert first == second and first.order[:3] == [high, low1, low2]
    # the store reads the queue in admission-key order; the engine decides alike in any order
    assert [j.id for j in snap.waiting] == [high, low1, low2]
    assert engine.admit(snap.model_copy(update={"waiting": snap.waiting[::-1]})) == first
    d = dispatcher(env, tmp_path)
    assert d.lease() == [high, low1]  # priority first, then submission time; the pool holds two
    assert set(held(env)) == {high, low1} and all(p == "local" for p, _ in held(env).values())
    assert d.lease() == []  # full: low2 waits, the two admitted hold their lease
    with env.app.state.sessions.begin() as session:
        waiting = engine.admit(build_snapshot(session)).waiting[low2]
    assert "waiting_for_capacity" in [r.code.value for r in waiting], waiting


def test_an_interrupted_submission_keeps_its_admission(env: Env, admin: dict[str, str], tmp_path: Path) -> None:
    pool(env, admin, 1)
    first = job(env, admin)
    second = job(env, admin)
    assert dispatcher(env, tmp_path, "dead").lease() == [first]
    with env.app.state.sessions.begin() as session:  # that dispatcher died; its lease ran out
        session.get(Job, first).lease_expires_at = None
    assert dispatcher(env, tmp_path, "d2").lease() == [first]  # re-leased, not re-decided: second still waits
    assert set(held(env)) == {first} and second not in held(env)


def test_two_dispatchers_on_postgresql_never_admit_past_a_pools_size(pg_env: Env, tmp_path: Path) -> None:
    env = pg_env
    admin = env.headers(env.token("admin"))
    pool(env, admin, 3)
    for team in ("alpha", "beta", "gamma"):
        env.token("member", team=team)
    for i in range(6):
        job(env, admin, team=("alpha", "beta", "gamma")[i % 3], priority=i % 2)
    dispatchers = [dispatcher(env, tmp_path, f"d{i}") for i in range(2)]
    leased: list[list[int]] = [[], []]
    start, stop = threading.Barrier(3), threading.Event()

    def run(i: int) -> None:
        start.wait()
        while not stop.is_set():
            leased[i] += dispatchers[i].lease()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    start.wait()
    # Higher-priority jobs keep arriving while both decide, so their snapshots differ from cycle to cycle.
    for i in range(20):
        job(env, admin, team=("alpha", "beta", "gamma")[i % 3], priority=10 + i)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    both = leased[0] + leased[1]
    assert len(both) == len(set(both)) == 3, leased  # each admitted job leased once, by one of them
    assert sum(g for _, g in held(env).values()) == 3
