"""dashboard sessions: signing in makes a session of its own, which signing out ends

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-09 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """`ui_sessions`, empty: a browser whose cookie holds an API token (as before) signs in again."""
    op.create_table(
        "ui_sessions",
        sa.Column("id_hash", sa.String(length=64), nullable=False),
        sa.Column("token_id", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["token_id"], ["api_tokens.id"], name=op.f("fk_ui_sessions_token_id_api_tokens")),
        sa.PrimaryKeyConstraint("id_hash", name=op.f("pk_ui_sessions")),
    )
    op.create_index(op.f("ix_ui_sessions_token_id"), "ui_sessions", ["token_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_ui_sessions_token_id"), table_name="ui_sessions")
    op.drop_table("ui_sessions")
