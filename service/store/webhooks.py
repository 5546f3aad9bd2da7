"""Webhook subscriptions and their outbox: create, list, delete, rotate, enqueue, deliveries, redeliver.

Visibility follows the jobs': a member sees and manages its team's subscriptions only; an admin
sees every one and may make one for every team (`team_id` NULL). A subscription another team owns
does not exist for a member (`NotFound`).

`enqueue` is called by `service.store.states.add_event` for every event, in the transaction that
writes it: one outbox row per live subscription the event matches, so that the event and the
promise to deliver it commit together or not at all.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import ColumnElement, Exists, and_, delete, exists, or_, select, update
from sqlalchemy.orm import InstrumentedAttribute, Session

from service.store.models import Event, Job, Team, utcnow
from service.store.notify_models import (
    Delivery,
    OutboxEntry,
    OutboxState,
    Webhook,
    WebhookFormat,
)
from service.store.tokens import NotFound, Principal
from service.store.visibility import team_scope
from service.store.vocab import EventKind, JobStatus, MeasurementKind, Role

ALL_EVENTS = "*"
WEBHOOK_PREFIX = "wh_"
SECRET_PREFIX = "whsec_"


def event_types() -> list[str]:
    """Every event kind the store writes: `job.<status>` for each status, each measurement kind, and
    the `EventKind` constants (read from the class, so a constant added there is valid here)."""
    kinds = {EventKind.status(s) for s in JobStatus} | {EventKind.measurement(m) for m in MeasurementKind}
    kinds |= {v for k, v in vars(EventKind).items() if k.isupper() and isinstance(v, str)}
    return sorted(kinds)


class InvalidWebhook(ValueError):
    """A subscription the store refuses; `field` names what to change."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


def check_events(events: list[str]) -> list[str]:
    """The event types, deduplicated in order; `InvalidWebhook` naming the valid ones otherwise."""
    if not events:
        raise InvalidWebhook("events", f'name at least one event type, or ["{ALL_EVENTS}"] for all')
    known = set(event_types())
    unknown = [e for e in events if e != ALL_EVENTS and e not in known]
    if unknown:
        raise InvalidWebhook("events", f"unknown event type(s) {', '.join(map(repr, unknown))}; valid:"
                             f" {', '.join(sorted(known))}, or \"{ALL_EVENTS}\" for all")
    return list(dict.fromkeys(events))


@dataclass(frozen=True, slots=True)
class NewWebhook:
    """A checked subscription to create (`url` already passed `service.notify.addresses.check_url`)."""

    url: str
    events: list[str]
    description: str
    format: WebhookFormat
    team: str | None  # None: the caller's team (member) or every team (admin)


def _team_for(session: Session, principal: Principal, team: str | None) -> Team | None:
    if principal.role == Role.MEMBER:  # its own team: the route refused another (`ops.access.acting_team`)
        return session.get(Team, principal.team_id)
    if principal.role != Role.ADMIN:
        raise InvalidWebhook("token", "a job token cannot subscribe to events")
    if team is None:
        return None
    found = session.scalar(select(Team).where(Team.name == team))
    if found is None:
        raise InvalidWebhook("team", f"no team named {team!r}; leave team out for every team")
    return found


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def create_webhook(session: Session, principal: Principal, new: NewWebhook) -> tuple[Webhook, str]:
    """The subscription and its signing secret (to show once)."""
    team = _team_for(session, principal, new.team)
    secret = new_secret()
    row = Webhook(public_id=WEBHOOK_PREFIX + secrets.token_hex(12), team_id=team.id if team else None,
                  url=new.url, events=check_events(new.events), description=new.description, format=new.format,
                  secret=secret, created_by=principal.actor)
    session.add(row)
    session.flush()
    return row, secret


def _visible(principal: Principal) -> Any:
    """The subscriptions `principal` sees: every team's and the every-team ones for an admin, a member's
    own team's, none for a job token (`visibility.team_scope`)."""
    clause = Webhook.deleted_at.is_(None)
    scope = team_scope(principal, Webhook.team_id)
    return clause if scope is None else clause & scope


def list_webhooks(session: Session, principal: Principal) -> list[Webhook]:
    return list(session.scalars(select(Webhook).where(_visible(principal)).order_by(Webhook.id)))


def visible_webhook(session: Session, principal: Principal, public_id: str, *, for_update: bool = False) -> Webhook:
    stmt = select(Webhook).where(Webhook.public_id == public_id, _visible(principal))
    row = session.scalar(stmt.with_for_update(of=Webhook) if for_update else stmt)
    if row is None:
        raise NotFound(f"no webhook {public_id}")
    return row


def delete_webhook(session: Session, principal: Principal, public_id: str) -> Webhook:
    """Deleted for good, in the caller's transaction: nothing more is delivered, and nothing of it is
    left pending. Its pending outbox rows never attempted are deleted; those attempted before (the
    deliveries log names them), or in flight now, are closed as skipped, their lease cleared, so that
    an attempt in flight is logged and schedules nothing more. Its deliveries log stays."""
    row = visible_webhook(session, principal, public_id, for_update=True)
    now = utcnow()
    row.deleted_at = now
    pending = and_(OutboxEntry.webhook_id == row.id, OutboxEntry.next_attempt_at.is_not(None))
    # Attempts are counted in the lease's commit, before the send: a row at 0 has no attempt logged or
    # in flight. On PostgreSQL a row leased concurrently is re-read at its new count and kept here.
    session.execute(delete(OutboxEntry).where(pending, OutboxEntry.attempts == 0))
    session.execute(update(OutboxEntry).where(pending).values(
        state=OutboxState.SKIPPED, next_attempt_at=None, done_at=now, lease_owner=None, lease_expires_at=None))
    return row


def rotate_secret(session: Session, principal: Principal, public_id: str, *, grace_s: float) -> tuple[Webhook, str]:
    """A new secret; the current one keeps signing beside it for `grace_s` seconds."""
    row = visible_webhook(session, principal, public_id, for_update=True)
    row.previous_secret = row.secret
    row.previous_secret_expires_at = utcnow() + timedelta(seconds=grace_s)
    row.secret = new_secret()
    return row, row.secret


def signing_secrets(row: Webhook, now: datetime) -> list[str]:
    """The secrets that sign a delivery now: the current one, then the previous one during its grace."""
    expires = row.previous_secret_expires_at
    if row.previous_secret and expires is not None and now < expires:
        return [row.secret, row.previous_secret]
    return [row.secret]


# --- the outbox --------------------------------------------------------------------------------------


def matches(patterns: list[str], kind: str) -> bool:
    return ALL_EVENTS in patterns or kind in patterns


class JobFacts(Protocol):
    """What a delivery tells of a job: an ORM `Job` or a job as a Core insert wrote it."""

    @property
    def id(self) -> int: ...

    @property
    def name(self) -> str: ...

    @property
    def status(self) -> JobStatus: ...

    @property
    def backend(self) -> str: ...

    @property
    def priority(self) -> int: ...


def job_view(job: JobFacts, team: str) -> dict[str, Any]:
    """What a delivery says about the job, as it is when the event is written."""
    return {"id": job.id, "name": job.name, "status": job.status.value, "team": team,
            "backend": str(job.backend), "priority": job.priority}


_SUBSCRIPTIONS = "shardctl.webhook_subscriptions"
TeamIdExpr = ColumnElement[int] | InstrumentedAttribute[int]


def live_for(team_id: TeamIdExpr | int) -> ColumnElement[bool]:
    """The webhooks that get the events of team `team_id` (a value or a column): neither deleted nor
    disabled, and the team's own or every team's."""
    return and_(Webhook.deleted_at.is_(None), Webhook.disabled_at.is_(None),
                or_(Webhook.team_id.is_(None), Webhook.team_id == team_id))


def subscribed(team_id: TeamIdExpr) -> Exists:
    """Whether any webhook gets team `team_id`'s events: an EXISTS to read along with the team."""
    return exists().where(live_for(team_id))


def known_unsubscribed(session: Session, team_id: int) -> None:
    """Record that no webhook gets `team_id`'s events, as this transaction has just read (`subscribed`),
    so that `enqueue` does not read the subscriptions again in this transaction."""
    _transaction_cache(session)[team_id] = []


def _transaction_cache(session: Session) -> dict[int, list[tuple[int, list[str]]]]:
    transaction = session.get_transaction()
    cached = session.info.get(_SUBSCRIPTIONS)
    if cached is None or cached[0] is not transaction:
        cached = (transaction, {})
        session.info[_SUBSCRIPTIONS] = cached
    by_team: dict[int, list[tuple[int, list[str]]]] = cached[1]
    return by_team


def _live_subscriptions(session: Session, team_id: int) -> list[tuple[int, list[str]]]:
    """(id, event patterns) of the live subscriptions that get `team_id`'s events: read once per
    transaction and team, then kept for the rest of that transaction (one often writes several events:
    a job that went from PENDING to SUCCEEDED between two polls, a submission and its note). Never across
    transactions: a subscription made or deleted in another process
    counts from the next transaction on."""
    by_team = _transaction_cache(session)
    if team_id not in by_team:
        rows = session.execute(select(Webhook.id, Webhook.events).where(live_for(team_id))).all()
        by_team[team_id] = [(webhook_id, list(patterns or [])) for webhook_id, patterns in rows]
    return by_team[team_id]


def enqueue(session: Session, job: Job, event: Event) -> int:
    """One pending outbox row per live subscription `event` matches (the job's team's and every
    team's), in the caller's transaction; returns how many. The body is fixed here, so every
    attempt sends what was true when the event was written. Flushes only when something matches."""
    wanted = _wanted(session, job.team_id, event.kind)
    if not wanted:
        return 0
    session.flush()  # the event's id and time, which the body carries
    team = session.get(Team, job.team_id)
    return _add_deliveries(session, wanted, team.name if team else "", job,
                           WrittenEvent(event.id, event.kind, event.at, event.message, event.data))


@dataclass(frozen=True, slots=True)
class WrittenEvent:
    """An event row already inserted in this transaction (by a Core statement, with its id)."""

    id: int
    kind: str
    at: datetime
    message: str
    data: dict[str, Any]


def enqueue_written(session: Session, team_id: int, team: str, job: JobFacts, event: WrittenEvent) -> int:
    """`enqueue` for an event already written, of `job` in team `team_id` named `team`."""
    wanted = _wanted(session, team_id, event.kind)
    return _add_deliveries(session, wanted, team, job, event) if wanted else 0


def _add_deliveries(session: Session, wanted: list[int], team: str, job: JobFacts, event: WrittenEvent) -> int:
    now = utcnow()
    payload = {"id": event.id, "type": event.kind, "created_at": event.at.isoformat(), "team": team or None,
               "job": job_view(job, team), "message": event.message, "data": event.data}
    for webhook_id in wanted:
        session.add(OutboxEntry(webhook_id=webhook_id, event_id=event.id, payload=payload, state=OutboxState.PENDING,
                                attempts=0, next_attempt_at=now, retry_from=now))
    return len(wanted)


def _wanted(session: Session, team_id: int, kind: str) -> list[int]:
    return [webhook_id for webhook_id, patterns in _live_subscriptions(session, team_id) if matches(patterns, kind)]


def list_deliveries(session: Session, webhook: Webhook, *, limit: int = 50,
                    before: int | None = None) -> tuple[list[Delivery], int | None]:
    """Newest first; a page and the cursor of the next one (None at the end)."""
    stmt = select(Delivery).where(Delivery.webhook_id == webhook.id)
    if before is not None:
        stmt = stmt.where(Delivery.id < before)
    rows = list(session.scalars(stmt.order_by(Delivery.id.desc()).limit(limit + 1)))
    return rows[:limit], (rows[limit - 1].id if len(rows) > limit else None)


def redeliver(session: Session, webhook: Webhook, delivery_id: str) -> OutboxEntry:
    """Deliver the event of delivery `delivery_id` again: its outbox row is pending again, due now,
    with a fresh horizon (the attempt numbers go on). A pending one is made due now."""
    delivery = session.scalar(select(Delivery).where(Delivery.public_id == delivery_id,
                                                     Delivery.webhook_id == webhook.id))
    if delivery is None:
        raise NotFound(f"no delivery {delivery_id} of webhook {webhook.public_id}")
    now = utcnow()
    session.execute(update(OutboxEntry).where(OutboxEntry.id == delivery.outbox_id).values(
        state=OutboxState.PENDING, next_attempt_at=now, retry_from=now, done_at=None))
    entry = session.get(OutboxEntry, delivery.outbox_id, populate_existing=True)
    assert entry is not None
    return entry
