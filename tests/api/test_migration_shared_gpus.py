"""Migration 0005 (shared GPUs) backfills what admission reads from the jobs already stored."""

from __future__ import annotations

import sqlalchemy as sa

from service.store import migrate
from tests.specs import tiny_plan


def test_migration_0005_backfills_gpu_counts_and_admission_from_existing_rows(db_url: str) -> None:
    migrate.downgrade(db_url, "0004")
    engine = sa.create_engine(db_url)
    plan = tiny_plan().model_dump(mode="json")
    plan.update(gpu="H100-SXM-80GB", world_size=16)
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO teams (name, created_at) VALUES ('alpha', CURRENT_TIMESTAMP)"))
        team_id = conn.execute(sa.text("SELECT id FROM teams")).scalar_one()
        jobs = sa.table("jobs", *(sa.column(c) for c in ("id", "name", "team_id", "status", "backend", "priority",
                                                          "created_by", "created_at", "updated_at", "layout")),
                        sa.column("spec", sa.JSON()), sa.column("plan", sa.JSON()))
        for job_id, status, stored in ((1, "RUNNING", plan), (2, "QUEUED", plan), (3, "QUEUED", {})):
            conn.execute(jobs.insert().values(id=job_id, name="old", team_id=team_id, status=status, backend="local",
                                              priority=0, created_by="t", created_at=sa.func.now(),
                                              updated_at=sa.func.now(), layout="", spec={}, plan=stored))
        conn.execute(sa.text("INSERT INTO attempts (job_id, number, backend_name, nodes, status, created_at)"
                             " VALUES (1, 1, 'shardctl-1-1', '[]', 'RUNNING', CURRENT_TIMESTAMP)"))
    migrate.upgrade(db_url)
    with engine.begin() as conn:
        rows = {r[0]: r[1:] for r in conn.execute(sa.text(
            "SELECT id, gpu, gpus, pool, admitted_at IS NOT NULL, predicted_s FROM jobs ORDER BY id"))}
        started = conn.execute(sa.text("SELECT started_at IS NOT NULL FROM attempts")).scalar_one()
    engine.dispose()
    predicted = tiny_plan().time.step_s * tiny_plan().training.steps  # type: ignore[union-attr]
    gpu, gpus, pool, admitted, seconds = rows[1]
    assert (gpu, gpus, pool, bool(admitted)) == ("H100-SXM-80GB", 16, None, True)  # running: it holds GPUs
    assert abs(seconds - predicted) < 1e-9
    assert rows[2][:4] == ("H100-SXM-80GB", 16, None, False)  # queued: waits for admission
    assert rows[3][:3] == ("", 1, None) and rows[3][4] is None  # a plan without them: nothing invented
    assert bool(started)  # an attempt known to have run counts usage from its creation
