"""job list columns: the layout line and predicted step time, copied out of the plan

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 10:53:41
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("layout", sa.String(length=200), nullable=False, server_default=""))
        batch_op.add_column(sa.Column("predicted_step_s", sa.Float(), nullable=True))
    bind = op.get_bind()
    jobs = sa.table("jobs", sa.column("id", sa.BigInteger()), sa.column("plan", sa.JSON()),
                    sa.column("layout", sa.String()), sa.column("predicted_step_s", sa.Float()))
    for job_id, plan in bind.execute(sa.select(jobs.c.id, jobs.c.plan)).all():
        plan = json.loads(plan) if isinstance(plan, str) else plan or {}
        bind.execute(jobs.update().where(jobs.c.id == job_id).values(
            layout=_layout_line(plan), predicted_step_s=(plan.get("time") or {}).get("step_s")))


def _layout_line(plan: dict[str, Any]) -> str:
    """The line `Layout.short` gave rows when this revision was written, frozen here so that the
    migration does not change with the application's code; "" for a plan without a usable layout."""
    lay = plan.get("layout")
    if not isinstance(lay, dict):
        return ""
    try:
        parts = [str(lay["sharding"]), *(f"{k}={lay[k]}" for k in ("dp", "tp", "pp", "cp"))]
        if lay["sharding"] == "hsdp":
            parts.append(f"shard={lay['dp_shard']}")
        if lay.get("sequence_parallel"):
            parts.append("sp")
        parts += [f"mb={lay['micro_batch']}x{lay['grad_accum_steps']}", f"ac={lay['activation_checkpointing']}"]
        if lay["pp"] > 1 and lay.get("pipeline_schedule"):
            virtual = lay.get("virtual_stages", 1)
            parts.append(str(lay["pipeline_schedule"]) + (f"/v{virtual}" if virtual > 1 else ""))
        if lay.get("offload", "none") != "none":
            parts.append(f"offload={lay['offload']}")
    except (KeyError, TypeError):
        return ""
    return " ".join(parts)[:200]


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("predicted_step_s")
        batch_op.drop_column("layout")
