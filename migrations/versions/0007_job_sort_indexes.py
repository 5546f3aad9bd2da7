"""job sort indexes: one (column, id) index per sortable column of the Jobs list, and a team-led one
for members (whose lists are always narrowed to their team) and for the team filter

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 18:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: name -> columns. Status and name already have (column, id) and team (team_id, id) from 0001.
INDEXES: dict[str, list[str]] = {
    "ix_jobs_gpus_id": ["gpus", "id"],
    "ix_jobs_finished_at_id": ["finished_at", "id"],
    "ix_jobs_team_id_status_id": ["team_id", "status", "id"],
    "ix_jobs_team_id_gpus_id": ["team_id", "gpus", "id"],
    "ix_jobs_team_id_name_id": ["team_id", "name", "id"],
    "ix_jobs_team_id_finished_at_id": ["team_id", "finished_at", "id"],
}


def upgrade() -> None:
    for name, columns in INDEXES.items():
        op.create_index(name, "jobs", columns, unique=False)


def downgrade() -> None:
    for name in reversed(INDEXES):
        op.drop_index(name, table_name="jobs")
