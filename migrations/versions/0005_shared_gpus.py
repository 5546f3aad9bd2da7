"""shared GPUs: pools, team quotas, admission columns on jobs

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 00:30:00
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: job statuses that hold GPUs (admitted before this revision: their pool is unknown, NULL)
ADMITTED = ("SUBMITTING", "PENDING", "RUNNING", "CANCELLING")


def upgrade() -> None:
    """`pools` and `team_quotas` (documents as JSON), four columns on `jobs` (`gpu`, `gpus` backfilled
    from each job's plan; `pool` NULL; `admitted_at` the creation time of jobs already admitted) and
    `attempts.started_at` (backfilled with the creation time of attempts known to have run: RUNNING or
    SUCCEEDED; others NULL, so usage from before this revision is a lower bound)."""
    json_type = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
    op.create_table(
        "pools",
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("pool", json_type, nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_pools")),
    )
    op.create_table(
        "team_quotas",
        sa.Column("team_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("quota", json_type, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], name=op.f("fk_team_quotas_team_id_teams")),
        sa.PrimaryKeyConstraint("team_id", name=op.f("pk_team_quotas")),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("gpu", sa.String(length=64), nullable=False, server_default=""))
        batch_op.add_column(sa.Column("gpus", sa.Integer(), nullable=False, server_default="1"))
        batch_op.add_column(sa.Column("pool", sa.String(length=63), nullable=True))
        batch_op.add_column(sa.Column("admitted_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("predicted_s", sa.Float(), nullable=True))
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("started_at", sa.DateTime(timezone=True), nullable=True))

    bind = op.get_bind()
    jobs = sa.table("jobs", sa.column("id", sa.BigInteger()), sa.column("plan", sa.JSON()),
                    sa.column("status", sa.String()), sa.column("created_at", sa.DateTime(timezone=True)),
                    sa.column("gpu", sa.String()), sa.column("gpus", sa.Integer()),
                    sa.column("admitted_at", sa.DateTime(timezone=True)), sa.column("predicted_s", sa.Float()))
    for job_id, plan in bind.execute(sa.select(jobs.c.id, jobs.c.plan)).all():
        gpu, gpus, predicted = _needs(json.loads(plan) if isinstance(plan, str) else plan or {})
        bind.execute(jobs.update().where(jobs.c.id == job_id).values(gpu=gpu, gpus=gpus, predicted_s=predicted))
    bind.execute(jobs.update().where(jobs.c.status.in_(ADMITTED)).values(admitted_at=jobs.c.created_at))
    attempts = sa.table("attempts", sa.column("status", sa.String()),
                        sa.column("created_at", sa.DateTime(timezone=True)),
                        sa.column("started_at", sa.DateTime(timezone=True)))
    bind.execute(attempts.update().where(attempts.c.status.in_(("RUNNING", "SUCCEEDED")))
                 .values(started_at=attempts.c.created_at))


def _needs(plan: dict[str, Any]) -> tuple[str, int, float | None]:
    """The GPU kind, count and predicted run time (steps x step time) of a stored plan, read as plans
    were written when this revision was (frozen here, not the application's `Plan`); ("", 1, None)
    for a plan without them."""
    gpu = plan.get("gpu")
    world = plan.get("world_size")
    step_s = (plan.get("time") or {}).get("step_s")
    steps = (plan.get("training") or {}).get("steps")
    predicted = (float(step_s) * steps if isinstance(step_s, int | float) and isinstance(steps, int) else None)
    return (gpu[:64] if isinstance(gpu, str) else "",
            world if isinstance(world, int) and not isinstance(world, bool) and world >= 1 else 1, predicted)


def downgrade() -> None:
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.drop_column("started_at")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("predicted_s")
        batch_op.drop_column("admitted_at")
        batch_op.drop_column("pool")
        batch_op.drop_column("gpus")
        batch_op.drop_column("gpu")
    op.drop_table("team_quotas")
    op.drop_table("pools")
