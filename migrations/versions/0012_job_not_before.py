"""a retry's back-off in a column of its own: `jobs.not_before`; `lease_expires_at` is a lease only

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07 22:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JOBS = sa.table("jobs", sa.column("lease_owner", sa.String()),
                 sa.column("lease_expires_at", sa.DateTime(timezone=True)),
                 sa.column("not_before", sa.DateTime(timezone=True)))


def upgrade() -> None:
    """`jobs.not_before`, NULL; a back-off under way, held until now as a lease expiry with no owner, moves
    into it (and the lease expiry is cleared)."""
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("not_before", sa.DateTime(timezone=True), nullable=True))
    jobs = _JOBS.c
    op.get_bind().execute(_JOBS.update().where(jobs.lease_owner.is_(None), jobs.lease_expires_at.is_not(None))
                          .values(not_before=jobs.lease_expires_at, lease_expires_at=None))


def downgrade() -> None:
    """A back-off goes back to being a lease expiry with no owner (a job that holds a lease keeps it)."""
    jobs = _JOBS.c
    op.get_bind().execute(_JOBS.update().where(jobs.lease_owner.is_(None), jobs.not_before.is_not(None))
                          .values(lease_expires_at=jobs.not_before))
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("not_before")
