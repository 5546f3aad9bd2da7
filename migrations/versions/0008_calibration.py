"""calibration: one sample per succeeded run's report (the model's prediction and the measurement),
and the cursor of the reports read so far

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 19:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Both tables empty: the first calibration read fills them from the reports already stored."""
    big = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
    op.create_table(
        "calibration_samples",
        sa.Column("measurement_id", big, autoincrement=False, nullable=False),
        sa.Column("job_id", big, nullable=False),
        sa.Column("gpu", sa.String(length=64), nullable=False),
        sa.Column("family", sa.String(length=64), nullable=False),
        sa.Column("predicted_step_s", sa.Float(), nullable=False),
        sa.Column("measured_step_s", sa.Float(), nullable=True),
        sa.Column("predicted_peak_bytes", sa.Float(), nullable=False),
        sa.Column("measured_peak_bytes", sa.Float(), nullable=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_calibration_samples_job_id_jobs")),
        sa.PrimaryKeyConstraint("measurement_id", name=op.f("pk_calibration_samples")),
    )
    op.create_index("ix_calibration_samples_gpu_family_measurement_id", "calibration_samples",
                    ["gpu", "family", "measurement_id"], unique=False)
    op.create_index(op.f("ix_calibration_samples_job_id"), "calibration_samples", ["job_id"], unique=False)
    op.create_table(
        "calibration_cursor",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("scanned_through", big, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_calibration_cursor")),
    )


def downgrade() -> None:
    op.drop_table("calibration_cursor")
    op.drop_index(op.f("ix_calibration_samples_job_id"), table_name="calibration_samples")
    op.drop_index("ix_calibration_samples_gpu_family_measurement_id", table_name="calibration_samples")
    op.drop_table("calibration_samples")
