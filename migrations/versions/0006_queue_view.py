"""the dispatcher's queue view: one row per waiting job, and when it was computed

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 04:45:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """`queue_view` and `queue_view_meta`, empty: the first dispatcher cycle fills them."""
    json_type = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
    op.create_table(
        "queue_view",
        sa.Column("job_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=False,
                  nullable=False),
        sa.Column("ord", sa.Integer(), nullable=False),
        sa.Column("team", sa.String(length=63), nullable=False),
        sa.Column("gpu", sa.String(length=64), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("pools", sa.Text(), nullable=False),
        sa.Column("doc", json_type, nullable=False),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_queue_view")),
    )
    op.create_index("ix_queue_view_gpu_ord", "queue_view", ["gpu", "ord"], unique=False)
    op.create_table(
        "queue_view_meta",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("computed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("jobs", sa.Integer(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_queue_view_meta")),
    )


def downgrade() -> None:
    op.drop_table("queue_view_meta")
    op.drop_index("ix_queue_view_gpu_ord", table_name="queue_view")
    op.drop_table("queue_view")
