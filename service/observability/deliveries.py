"""Webhook deliveries counted as their rows commit: every attempt the deliverer records
(`service.store.notify_models.Delivery`) adds one to `shardctl_webhook_deliveries_total{team, outcome}`
and its receiver's latency to `shardctl_webhook_delivery_seconds`, in the process that wrote it, once
its transaction commits. The deliverer needs no call of its own (so must not make one: it would count
twice). Importing this module registers the listeners; `service.observability.transitions` does, so
every process that writes through the store counts."""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import event, select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Mapper, Session, object_session

from service.observability import counters
from service.store.models import Team
from service.store.notify_models import Delivery, Webhook

log = logging.getLogger("shardctl.notify")
_PENDING = "shardctl.deliveries"


@event.listens_for(Delivery, "after_insert")
def _inserted(mapper: Mapper[Any], connection: Connection, target: Delivery) -> None:
    session = object_session(target)
    if session is None:
        return
    team = connection.scalar(select(Team.name).join(Webhook, Webhook.team_id == Team.id)
                             .where(Webhook.id == target.webhook_id))
    seconds = target.latency_ms / 1000 if target.latency_ms is not None else None
    session.info.setdefault(_PENDING, []).append((str(target.outcome), team, seconds))


@event.listens_for(Session, "after_commit")
def _after_commit(session: Session) -> None:
    for outcome, team, seconds in session.info.pop(_PENDING, ()):
        try:
            counters.record_delivery(outcome, team=team, seconds=seconds)
        except Exception:  # observability never breaks a delivery
            log.exception("could not count a webhook delivery")


@event.listens_for(Session, "after_rollback")
def _after_rollback(session: Session) -> None:
    session.info.pop(_PENDING, None)
