"""`shardctl worker` on SIGTERM: lets its cycle end for at most SHARDCTL_SHUTDOWN_GRACE_S, gives back the
jobs it leased and has not submitted (another dispatcher takes them at once), keeps the lease of a
submission still in flight (the next dispatcher finds or submits it by name once it runs out), exits 0."""

from __future__ import annotations

import fcntl
import os
import signal
from pathlib import Path

from sqlalchemy import select

from service.store.models import Job
from tests.db_fixtures import Env
from tests.server.procs import environ, shardctl, stop, wait_until
from tests.specs import tiny
from workers.backends.local_devices import LOCK_FILE


def test_sigterm_gives_back_the_leased_jobs_not_yet_submitted(env: Env, tmp_path: Path) -> None:
    admin = env.headers(env.token("admin"))
    ids = [env.client.post("/v1/jobs", json=tiny(name=f"held-{i}"), headers=admin).json()["id"] for i in range(2)]
    local = tmp_path / "data" / "local"
    local.mkdir(parents=True)
    # Hold the local backend's device lock: the worker's first submission waits on it, in flight, and the
    # second job of its batch stays leased and unsubmitted.
    lock = os.open(local / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    log, pools = tmp_path / "worker.log", tmp_path / "pools.yaml"
    pools.write_text("pools: [{name: shared-cpu, backend: local, gpu: cpu, gpus: 8}]\n")  # the worker loads it
    settings = {"SHARDCTL_DISPATCHER_BATCH": "2", "SHARDCTL_POOLS_FILE": str(pools),
                "SHARDCTL_LOCAL_DEVICES": "cpu:0-7", "SHARDCTL_SHUTDOWN_GRACE_S": "1",
                "SHARDCTL_DISPATCHER_INTERVAL_S": "0.1"}
    proc = shardctl(["worker"], environ(tmp_path, env.url, **settings), log)
    try:
        def leases() -> dict[str, tuple[str, str | None]]:
            with env.app.state.sessions.begin() as session:
                return {str(j.status): (j.name, j.lease_owner) for j in session.scalars(select(Job).order_by(Job.id))}

        def both_leased() -> bool:
            now = leases()
            return "SUBMITTING" in now and "QUEUED" in now and all(owner for _, owner in now.values())

        wait_until(both_leased, "one job in submission and one leased behind it", proc=proc, log=log)
        with env.app.state.sessions.begin() as session:
            assert set(session.scalars(select(Job.pool))) == {"shared-cpu"}  # admitted to the file's pool
        owner = leases()["QUEUED"][1]
        assert owner is not None and owner.endswith(f":{proc.pid}")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()[-3000:]
        after = leases()
        assert after["QUEUED"][1] is None  # given back: the next dispatcher leases it at once
        assert after["SUBMITTING"][1] == owner  # in flight when the grace ran out: its lease runs out instead
        assert "1 leased job(s) given back" in log.read_text()
        assert {name for name, _ in after.values()} == {f"held-{i}" for i in range(len(ids))}
    finally:
        stop(proc)
        os.close(lock)
