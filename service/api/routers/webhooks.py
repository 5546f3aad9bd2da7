"""Webhook subscriptions: create (the secret shown once), list, read, delete, rotate the secret, read
the deliveries log and redeliver. Members manage their team's subscriptions, admins any (and ones for
every team). See docs/notifications.md for what a delivery looks like and how to verify it."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response

from service.api.deps import Db, Person
from service.api.errors import ApiError
from service.api.notify_schemas import (
    DeliveryOut,
    DeliveryPage,
    RedeliveryOut,
    WebhookCreated,
    WebhookIn,
    WebhookOut,
    WebhookRotated,
)
from service.api.ops.access import acting_team
from service.api.routers.jobs import rendered
from service.api.schemas import ErrorField, ErrorResponse
from service.notify.addresses import AddressRefused, check_url
from service.store.notify_models import Delivery, Webhook
from service.store.webhooks import (
    InvalidWebhook,
    NewWebhook,
    create_webhook,
    delete_webhook,
    list_deliveries,
    list_webhooks,
    redeliver,
    rotate_secret,
    visible_webhook,
)

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"])
ERRORS: dict[int | str, dict[str, object]] = {404: {"model": ErrorResponse}, 422: {"model": ErrorResponse}}
WebhookId = Annotated[str, Path(max_length=40, description="The subscription's id (wh_...).")]
DeliveryId = Annotated[str, Path(max_length=40, description="A delivery's id (dlv_..., its Shardctl-Delivery-Id).")]


def webhook_out(row: Webhook) -> WebhookOut:
    return WebhookOut(id=row.public_id, team=row.team.name if row.team else None, url=row.url,
                      events=list(row.events), description=row.description, format=row.format,
                      created_by=row.created_by, created_at=row.created_at,
                      previous_secret_expires_at=row.previous_secret_expires_at, disabled_at=row.disabled_at,
                      disabled_reason=row.disabled_reason)


def delivery_out(row: Delivery) -> DeliveryOut:
    return DeliveryOut(id=row.public_id, event_id=row.event_id, event_type=row.event_type, attempt=row.attempt,
                       status_code=row.status_code, latency_ms=row.latency_ms, response_excerpt=row.response_excerpt,
                       error=row.error, outcome=row.outcome, at=row.at)


def _invalid(field: str, message: str) -> ApiError:
    return ApiError(422, "validation_error", f"invalid request: {field}: {message}",
                    fields=[ErrorField(loc=field, message=message)])


@router.post("", response_model=WebhookCreated, status_code=201, responses=ERRORS,
             summary="Subscribe a URL to events (the signing secret is in this response only)")
def post_webhook(body: WebhookIn, principal: Person, db: Db, request: Request) -> Response:
    """A member subscribes for its team; an admin for a team, or (no `team`) for every team. The URL
    must be http(s) and, unless SHARDCTL_WEBHOOK_ALLOW_PRIVATE=1, not on loopback or a private network
    (the host is resolved). Unknown event types are a 422 listing the valid ones."""
    try:
        check_url(body.url, allow_private=request.app.state.settings.webhook_allow_private)
    except AddressRefused as exc:
        raise _invalid("url", str(exc)) from exc
    new = NewWebhook(url=body.url, events=body.events, description=body.description, format=body.format,
                     team=acting_team(principal, body.team))
    with db.begin() as session:
        try:
            row, secret = create_webhook(session, principal, new)
        except InvalidWebhook as exc:
            raise _invalid(exc.field, exc.message) from exc
        return rendered(WebhookCreated(**webhook_out(row).model_dump(), secret=secret), 201)


@router.get("", response_model=list[WebhookOut], summary="The subscriptions this token may manage")
def get_webhooks(principal: Person, db: Db) -> list[WebhookOut]:
    with db.begin() as session:
        return [webhook_out(row) for row in list_webhooks(session, principal)]


@router.get("/{webhook_id}", response_model=WebhookOut, responses=ERRORS)
def get_webhook(webhook_id: WebhookId, principal: Person, db: Db) -> WebhookOut:
    with db.begin() as session:
        return webhook_out(visible_webhook(session, principal, webhook_id))


@router.delete("/{webhook_id}", status_code=204, responses=ERRORS,
               summary="Delete a subscription: nothing more is delivered; its deliveries log stays readable")
def remove_webhook(webhook_id: WebhookId, principal: Person, db: Db) -> Response:
    with db.begin() as session:
        delete_webhook(session, principal, webhook_id)
    return Response(status_code=204)


@router.post("/{webhook_id}/rotate", response_model=WebhookRotated, responses=ERRORS,
             summary="A new signing secret; the old one keeps signing beside it for the grace period")
def rotate(webhook_id: WebhookId, principal: Person, db: Db, request: Request) -> Response:
    """During the grace period (SHARDCTL_WEBHOOK_SECRET_GRACE_S) each delivery carries two `v1`
    signatures, by the new secret and by the old, so receivers can switch at any moment in it."""
    with db.begin() as session:
        row, secret = rotate_secret(session, principal, webhook_id,
                                    grace_s=request.app.state.settings.webhook_secret_grace_s)
        return rendered(WebhookRotated(id=row.public_id, secret=secret,
                                       previous_secret_expires_at=row.previous_secret_expires_at))


@router.get("/{webhook_id}/deliveries", response_model=DeliveryPage, responses=ERRORS,
            summary="Delivery attempts, newest first")
def get_deliveries(webhook_id: WebhookId, principal: Person, db: Db,
                   limit: Annotated[int, Query(ge=1, le=200)] = 50,
                   cursor: Annotated[str | None, Query(pattern=r"^\d{1,18}$")] = None) -> DeliveryPage:
    with db.begin() as session:
        row = visible_webhook(session, principal, webhook_id)
        items, next_cursor = list_deliveries(session, row, limit=limit, before=int(cursor) if cursor else None)
        return DeliveryPage(items=[delivery_out(d) for d in items],
                            next_cursor=str(next_cursor) if next_cursor is not None else None)


@router.post("/{webhook_id}/deliveries/{delivery_id}/redeliver", response_model=RedeliveryOut,
             status_code=202, responses={**ERRORS, 409: {"model": ErrorResponse}},
             summary="Deliver that delivery's event again (new attempts, a fresh retry horizon)")
def post_redeliver(webhook_id: WebhookId, delivery_id: DeliveryId, principal: Person, db: Db) -> Response:
    with db.begin() as session:
        row = visible_webhook(session, principal, webhook_id)
        if row.disabled_at is not None:
            raise ApiError(409, "webhook_disabled", f"webhook {webhook_id} is disabled ({row.disabled_reason});"
                           " create a new subscription for a receiver that is back")
        entry = redeliver(session, row, delivery_id)
        return rendered(RedeliveryOut(event_id=entry.event_id, state=entry.state,
                                      next_attempt_at=entry.next_attempt_at), 202)
