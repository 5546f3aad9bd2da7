"""notifications: webhooks, the event outbox and deliveries

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 00:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
AT = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "webhooks",
        sa.Column("id", ID, nullable=False),
        sa.Column("public_id", sa.String(length=40), nullable=False),
        sa.Column("team_id", ID, nullable=True),
        sa.Column("url", sa.String(length=2048), nullable=False),
        sa.Column("events", JSON, nullable=False),
        sa.Column("description", sa.String(length=500), nullable=False),
        sa.Column("format", sa.String(length=16), nullable=False),
        sa.Column("secret", sa.String(length=128), nullable=False),
        sa.Column("previous_secret", sa.String(length=128), nullable=True),
        sa.Column("previous_secret_expires_at", AT, nullable=True),
        sa.Column("disabled_at", AT, nullable=True),
        sa.Column("disabled_reason", sa.Text(), nullable=True),
        sa.Column("deleted_at", AT, nullable=True),
        sa.Column("created_by", sa.String(length=64), nullable=False),
        sa.Column("created_at", AT, nullable=False),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], name=op.f("fk_webhooks_team_id_teams")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhooks")),
        sa.UniqueConstraint("public_id", name=op.f("uq_webhooks_public_id")),
    )
    with op.batch_alter_table("webhooks", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_webhooks_team_id"), ["team_id"], unique=False)

    op.create_table(
        "webhook_outbox",
        sa.Column("id", ID, nullable=False),
        sa.Column("webhook_id", ID, nullable=False),
        sa.Column("event_id", ID, nullable=False),
        sa.Column("payload", JSON, nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", AT, nullable=True),
        sa.Column("retry_from", AT, nullable=False),
        sa.Column("lease_owner", sa.String(length=64), nullable=True),
        sa.Column("lease_expires_at", AT, nullable=True),
        sa.Column("created_at", AT, nullable=False),
        sa.Column("done_at", AT, nullable=True),
        sa.ForeignKeyConstraint(["event_id"], ["events.id"], name=op.f("fk_webhook_outbox_event_id_events")),
        sa.ForeignKeyConstraint(["webhook_id"], ["webhooks.id"], name=op.f("fk_webhook_outbox_webhook_id_webhooks")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_outbox")),
        sa.UniqueConstraint("webhook_id", "event_id", name=op.f("uq_webhook_outbox_webhook_id")),
    )
    with op.batch_alter_table("webhook_outbox", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_webhook_outbox_event_id"), ["event_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_webhook_outbox_next_attempt_at"), ["next_attempt_at"], unique=False)

    op.create_table(
        "webhook_deliveries",
        sa.Column("id", ID, nullable=False),
        sa.Column("public_id", sa.String(length=40), nullable=False),
        sa.Column("outbox_id", ID, nullable=False),
        sa.Column("webhook_id", ID, nullable=False),
        sa.Column("event_id", ID, nullable=False),
        sa.Column("event_type", sa.String(length=64), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("latency_ms", sa.Float(), nullable=True),
        sa.Column("response_excerpt", sa.Text(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("at", AT, nullable=False),
        sa.ForeignKeyConstraint(["event_id"], ["events.id"], name=op.f("fk_webhook_deliveries_event_id_events")),
        sa.ForeignKeyConstraint(["outbox_id"], ["webhook_outbox.id"],
                                name=op.f("fk_webhook_deliveries_outbox_id_webhook_outbox")),
        sa.ForeignKeyConstraint(["webhook_id"], ["webhooks.id"],
                                name=op.f("fk_webhook_deliveries_webhook_id_webhooks")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_deliveries")),
        sa.UniqueConstraint("public_id", name=op.f("uq_webhook_deliveries_public_id")),
    )
    with op.batch_alter_table("webhook_deliveries", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_webhook_deliveries_outbox_id"), ["outbox_id"], unique=False)
        batch_op.create_index("ix_webhook_deliveries_webhook_id_id", ["webhook_id", "id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("webhook_deliveries", schema=None) as batch_op:
        batch_op.drop_index("ix_webhook_deliveries_webhook_id_id")
        batch_op.drop_index(batch_op.f("ix_webhook_deliveries_outbox_id"))
    op.drop_table("webhook_deliveries")
    with op.batch_alter_table("webhook_outbox", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_webhook_outbox_next_attempt_at"))
        batch_op.drop_index(batch_op.f("ix_webhook_outbox_event_id"))
    op.drop_table("webhook_outbox")
    with op.batch_alter_table("webhooks", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_webhooks_team_id"))
    op.drop_table("webhooks")
