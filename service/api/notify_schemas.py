"""Request and response bodies of the event feed and the webhooks API (docs/notifications.md)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from service.names import Label
from service.store.notify_models import DeliveryOutcome, OutboxState, WebhookFormat


class FeedEventOut(BaseModel):
    id: int = Field(description="The event's id: the cursor (`since`, SSE `id:`).")
    job_id: int
    job_name: str
    team: str
    at: datetime
    actor: str
    kind: str
    message: str
    data: dict[str, Any]


class EventPage(BaseModel):
    items: list[FeedEventOut] = Field(description="Oldest first.")
    next_cursor: str = Field(description="Pass as `since` to read on: the last id returned, or `since` when none.")


class WebhookIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(max_length=2048, description="http:// or https://; not on loopback or a private network"
                     " unless the operator set SHARDCTL_WEBHOOK_ALLOW_PRIVATE=1.")
    events: list[str] = Field(min_length=1, max_length=64,
                              description='Event types (e.g. "job.succeeded", "job.failed"), or ["*"] for all.')
    description: str = Field("", max_length=500)
    format: WebhookFormat = Field(WebhookFormat.JSON, description="json: the signed event document; slack: a"
                                  ' Slack-compatible {"text": ...}.')
    team: Label | None = Field(None, description="Admins: the team whose events it gets (absent: every team)."
                               " Members: absent (their own team).")


class WebhookOut(BaseModel):
    id: str
    team: str | None = Field(description="null: every team's events.")
    url: str
    events: list[str]
    description: str
    format: WebhookFormat
    created_by: str
    created_at: datetime
    previous_secret_expires_at: datetime | None = Field(
        description="Until then the secret before the last rotation signs deliveries too.")
    disabled_at: datetime | None
    disabled_reason: str | None


class WebhookCreated(WebhookOut):
    secret: str = Field(description="The signing secret, shown this once.")


class WebhookRotated(BaseModel):
    id: str
    secret: str = Field(description="The new signing secret, shown this once.")
    previous_secret_expires_at: datetime | None = Field(
        description="Until then deliveries carry a signature by the old secret as well.")


class DeliveryOut(BaseModel):
    id: str = Field(description="The attempt's Shardctl-Delivery-Id.")
    event_id: int = Field(description="The event's id (Shardctl-Event-Id), the same on every attempt.")
    event_type: str
    attempt: int
    status_code: int | None
    latency_ms: float | None
    response_excerpt: str
    error: str | None
    outcome: DeliveryOutcome
    at: datetime


class DeliveryPage(BaseModel):
    items: list[DeliveryOut] = Field(description="Newest first.")
    next_cursor: str | None


class RedeliveryOut(BaseModel):
    event_id: int
    state: OutboxState
    next_attempt_at: datetime | None
