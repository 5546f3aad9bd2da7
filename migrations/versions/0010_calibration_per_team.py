"""calibration per team: each sample names the team whose job it came from, and samples are made
again from the reports against each job's stored plan

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-07 19:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_BIG = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _samples(*, team: bool) -> None:
    columns: list[sa.schema.SchemaItem] = [
        sa.Column("measurement_id", _BIG, autoincrement=False, nullable=False),
        sa.Column("job_id", _BIG, nullable=False),
        *([sa.Column("team_id", _BIG, nullable=False)] if team else []),
        sa.Column("gpu", sa.String(length=64), nullable=False),
        sa.Column("family", sa.String(length=64), nullable=False),
        sa.Column("predicted_step_s", sa.Float(), nullable=False),
        sa.Column("measured_step_s", sa.Float(), nullable=True),
        sa.Column("predicted_peak_bytes", sa.Float(), nullable=False),
        sa.Column("measured_peak_bytes", sa.Float(), nullable=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_calibration_samples_job_id_jobs")),
        *([sa.ForeignKeyConstraint(["team_id"], ["teams.id"], name=op.f("fk_calibration_samples_team_id_teams"))]
          if team else []),
        sa.PrimaryKeyConstraint("measurement_id", name=op.f("pk_calibration_samples")),
    ]
    op.create_table("calibration_samples", *columns)
    op.create_index(op.f("ix_calibration_samples_job_id"), "calibration_samples", ["job_id"], unique=False)
    if team:
        op.create_index("ix_calibration_samples_team_id_gpu_family_measurement_id", "calibration_samples",
                        ["team_id", "gpu", "family", "measurement_id"], unique=False)
    op.create_index("ix_calibration_samples_gpu_family_measurement_id", "calibration_samples",
                    ["gpu", "family", "measurement_id"], unique=False)


def _drop_samples(*, team: bool) -> None:
    if team:
        op.drop_index("ix_calibration_samples_team_id_gpu_family_measurement_id", table_name="calibration_samples")
    op.drop_index("ix_calibration_samples_gpu_family_measurement_id", table_name="calibration_samples")
    op.drop_index(op.f("ix_calibration_samples_job_id"), table_name="calibration_samples")
    op.drop_table("calibration_samples")


def upgrade() -> None:
    """Samples made before took their prediction and layout from the job's own report, which the job
    may forge: they are dropped, and the next calibration read makes them again from every report."""
    _drop_samples(team=False)
    _samples(team=True)
    op.execute("UPDATE calibration_cursor SET scanned_through = 0")


def downgrade() -> None:
    _drop_samples(team=True)
    _samples(team=False)
    op.execute("UPDATE calibration_cursor SET scanned_through = 0")
