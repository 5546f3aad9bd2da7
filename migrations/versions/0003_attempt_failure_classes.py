"""attempt failure classes: the class and evidence of each finished attempt

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 00:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Two nullable columns: `failure` (a `FailureClass` value, VARCHAR(32) like every enum column) and
    `log_tail` (the last lines the program printed). Attempts that ended before this revision keep
    NULL in both: their class was only ever written in the event data."""
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("failure", sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column("log_tail", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.drop_column("log_tail")
        batch_op.drop_column("failure")
