"""measurements by kind: a (kind, id) index, so calibration finds the reports newer than its cursor
without reading every heartbeat since the last report

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 15:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_measurements_kind_id", "measurements", ["kind", "id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_measurements_kind_id", table_name="measurements")
