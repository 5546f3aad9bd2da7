"""attempt failure classes: the class and evidence of each finished attempt

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 00:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
