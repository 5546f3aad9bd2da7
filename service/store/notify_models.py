"""Notification tables: webhook subscriptions, the outbox of (webhook, event) deliveries to make, and
the log of every delivery attempt.

`service.store.schema` loads this module with the other model modules, so that these tables are part
of the schema's metadata (migrations, drift checks, the test fixtures).

- `Webhook`: a subscription. `team_id` NULL means every team (admin only). The signing secret is
  stored as it is (it signs, so it cannot be hashed); the API shows it once. After a rotation the
  previous secret keeps signing beside the new one until `previous_secret_expires_at`. A deleted
  subscription keeps its row (`deleted_at`) so that its deliveries stay readable; its pending outbox
  rows go in the deleting transaction (`service.store.webhooks.delete_webhook`).
- `OutboxEntry`: one (webhook, event) pair, written in the transaction that wrote the event. It is
  pending while `next_attempt_at` is set; its body (`payload`) is fixed when written, so every
  attempt sends the same document. A delivery worker leases it (`lease_owner`, `lease_expires_at`),
  in turn with the other subscriptions' rows (`workers.notify.due_in_turn`), and counts the attempt
  (`attempts`) in one commit before it sends, so no attempt is made twice.
- `Delivery`: one attempt: its public id (the `Shardctl-Delivery-Id` header), status code, latency,
  the first bytes of the response, the error, and what came of it.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from service.store.models import Base, BigId, Event, Json, Team, UtcDateTime, enum_column, utcnow


class WebhookFormat(StrEnum):
    """What a delivery's body looks like: shardctl's own JSON document, or Slack's `{"text": ...}`."""

    JSON = "json"
    SLACK = "slack"


class OutboxState(StrEnum):
    """Where one (webhook, event) delivery is."""

    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"  # a final answer (4xx), the horizon passed, or the receiver is gone (410)
    SKIPPED = "skipped"  # the subscription was deleted or disabled before it was delivered


class DeliveryOutcome(StrEnum):
    """What came of one attempt."""

    DELIVERED = "delivered"  # 2xx
    RETRYING = "retrying"  # 5xx, 408, 429, a timeout or a connection error: another attempt follows
    FAILED = "failed"  # another 4xx, or an address that is not allowed: final
    GAVE_UP = "gave_up"  # retryable, but the next attempt would be past the horizon
    DISABLED = "disabled"  # 410 Gone: the subscription is disabled


class Webhook(Base):
    __tablename__ = "webhooks"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    public_id: Mapped[str] = mapped_column(String(40), unique=True)
    team_id: Mapped[int | None] = mapped_column(ForeignKey("teams.id"), index=True)
    url: Mapped[str] = mapped_column(String(2048))
    events: Mapped[list[str]] = mapped_column(Json, default=list)
    description: Mapped[str] = mapped_column(String(500), default="")
    format: Mapped[WebhookFormat] = mapped_column(enum_column(WebhookFormat, 16))
    secret: Mapped[str] = mapped_column(String(128))
    previous_secret: Mapped[str | None] = mapped_column(String(128))
    previous_secret_expires_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    disabled_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    disabled_reason: Mapped[str | None] = mapped_column(Text)
    deleted_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    created_by: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)

    team: Mapped[Team | None] = relationship(lazy="joined")


class OutboxEntry(Base):
    __tablename__ = "webhook_outbox"
    __table_args__ = (UniqueConstraint("webhook_id", "event_id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    webhook_id: Mapped[int] = mapped_column(ForeignKey("webhooks.id"))
    event_id: Mapped[int] = mapped_column(ForeignKey("events.id"), index=True)
    payload: Mapped[dict[str, Any]] = mapped_column(Json)
    state: Mapped[OutboxState] = mapped_column(enum_column(OutboxState, 16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), index=True)
    retry_from: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)  # the horizon runs from here
    lease_owner: Mapped[str | None] = mapped_column(String(64))
    lease_expires_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    done_at: Mapped[datetime | None] = mapped_column(UtcDateTime())

    webhook: Mapped[Webhook] = relationship(lazy="joined", innerjoin=True)
    event: Mapped[Event] = relationship()


class Delivery(Base):
    __tablename__ = "webhook_deliveries"
    __table_args__ = (Index("ix_webhook_deliveries_webhook_id_id", "webhook_id", "id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    public_id: Mapped[str] = mapped_column(String(40), unique=True)
    outbox_id: Mapped[int] = mapped_column(ForeignKey("webhook_outbox.id"), index=True)
    webhook_id: Mapped[int] = mapped_column(ForeignKey("webhooks.id"))
    event_id: Mapped[int] = mapped_column(ForeignKey("events.id"))
    event_type: Mapped[str] = mapped_column(String(64))
    attempt: Mapped[int] = mapped_column(Integer)
    status_code: Mapped[int | None] = mapped_column(Integer)
    latency_ms: Mapped[float | None] = mapped_column(Float)
    response_excerpt: Mapped[str] = mapped_column(Text, default="")
    error: Mapped[str | None] = mapped_column(Text)
    outcome: Mapped[DeliveryOutcome] = mapped_column(enum_column(DeliveryOutcome, 16))
    at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
