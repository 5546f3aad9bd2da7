"""The webhook delivery worker: sends what the outbox holds, in the dispatcher's process, on its own
threads, so that a receiver that hangs never slows the dispatcher.

One round (`run_once`, or continuously `run_forever`):

1. **Lease** due outbox rows (pending, `next_attempt_at` passed, no live lease) in one transaction,
   round-robin across subscriptions (`due_in_turn`): each gets this worker's name, a lease expiry
   and its attempt number (`attempts + 1`), committed before anything is sent. PostgreSQL takes the
   rows `FOR UPDATE SKIP LOCKED`, so replicas never take the same row; SQLite serialises writers. A
   row whose subscription was disabled, or deleted after the row's transaction read it as live, is
   closed as skipped.
2. **Send** each on a bounded pool (`concurrency` at once, `timeout_s` each): a JSON POST signed
   with every valid secret (`service.notify.signing`), headers `Shardctl-Event-Id` (the event's id,
   the same on every attempt) and `Shardctl-Delivery-Id` (new each attempt). The address is checked
   again first (a name may have been pointed at a private address since).
3. **Record** the attempt in the deliveries log, and on the outbox row what follows: delivered
   (2xx); another attempt after an exponential, jittered, capped backoff (5xx, 408, 429 with its
   Retry-After, timeouts, connection errors) unless that falls past the horizon (given up);
   final for other answers; 410 also disables the subscription.

A worker that dies after the lease leaves the row leased; when the lease expires another worker
takes it with the next attempt number. Receivers may so see an event more than once (never an
attempt twice) and dedupe by `Shardctl-Event-Id`.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import httpx
from sqlalchemy import Select, case, func, or_, select
from sqlalchemy.orm import Session, sessionmaker

from service.notify import signing
from service.notify.addresses import AddressRefused, Unresolved, check_address, pinned
from service.notify.bodies import render
from service.notify.retry import GONE, backoff_s, is_retryable, retry_after_s
from service.store.models import utcnow
from service.store.notify_models import Delivery, DeliveryOutcome, OutboxEntry, OutboxState, WebhookFormat
from service.store.webhooks import signing_secrets
from workers.dispatch.context import failpoint

log = logging.getLogger("shardctl.notify")
#: How much of a receiver's answer the deliveries log keeps.
EXCERPT_BYTES = 1024
USER_AGENT = "shardctl-webhooks/1"


@dataclass
class NotifierConfig:
    owner: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:notify")
    timeout_s: float = 10.0
    concurrency: int = 8
    retry_base_s: float = 2.0
    retry_max_s: float = 3600.0
    horizon_s: float = 86400.0
    allow_private: bool = False

    @property
    def lease_s(self) -> float:
        """Longer than any one send can take (connect, write and read each time out), with room to record it."""
        return self.timeout_s * 4 + 5


@dataclass(frozen=True, slots=True)
class Leased:
    """One attempt this worker holds the lease for, with everything it needs to send it."""

    outbox_id: int
    attempt: int
    delivery_id: str
    webhook_id: int
    event_id: int
    event_type: str
    url: str
    format: WebhookFormat
    secrets: tuple[str, ...]
    payload: dict[str, Any]
    deadline: datetime  # no attempt is scheduled past this (the horizon)


@dataclass(frozen=True, slots=True)
class Answer:
    status: int | None = None
    latency_ms: float | None = None
    excerpt: str = ""
    error: str | None = None
    retry_after: str | None = None
    final_error: bool = False  # an error no retry can fix (an address that is not allowed)
    connect_failed: bool = False  # no connection to that address: the next checked one is tried


def due_in_turn(now: datetime, limit: int) -> Select[OutboxEntry]:
    """Up to `limit` outbox rows due at `now` and not leased, taken round-robin across subscriptions.

    Each subscription's due rows are numbered oldest first (`next_attempt_at`, then id), after its
    rows in flight (leased, lease not expired) by any worker: a subscription with k in flight offers
    its oldest due row as its (k+1)-th. Rows are taken by that number, then oldest first. So a
    subscription's backlog never holds back another's deliveries: each subscription with a due row
    gets the next free slot before any gets a second one, and a worker with few free slots gives them
    to the subscriptions with the fewest in flight. When one subscription alone has due rows, it gets
    every slot.

    The due conditions are in the outer query too: on PostgreSQL, where the caller locks the rows
    `FOR UPDATE SKIP LOCKED`, a row another worker leased and committed since the ranking read it is
    checked again on its new version, and left out.
    """
    free = or_(OutboxEntry.lease_expires_at.is_(None), OutboxEntry.lease_expires_at < now)
    turn = (select(OutboxEntry.id, func.row_number().over(
                partition_by=OutboxEntry.webhook_id,
                order_by=(case((free, 1), else_=0), OutboxEntry.next_attempt_at, OutboxEntry.id)).label("turn"))
            .where(OutboxEntry.next_attempt_at <= now).subquery("turn"))
    return (select(OutboxEntry).join(turn, turn.c.id == OutboxEntry.id)
            .where(OutboxEntry.next_attempt_at <= now, free)
            .order_by(turn.c.turn, OutboxEntry.next_attempt_at, OutboxEntry.id).limit(limit))


class Notifier:
    """Delivers the outbox of `sessions`' database; see the module's docstring."""

    def __init__(self, sessions: sessionmaker[Session], config: NotifierConfig | None = None) -> None:
        self.sessions = sessions
        self.config = config or NotifierConfig()
        self._postgres = sessions.kw["bind"].dialect.name == "postgresql"
        self.client = httpx.Client(timeout=httpx.Timeout(self.config.timeout_s), follow_redirects=False,
                                   trust_env=False, headers={"User-Agent": USER_AGENT})
        self._pool = ThreadPoolExecutor(max_workers=self.config.concurrency, thread_name_prefix="notify")

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self.client.close()

    # -- rounds -------------------------------------------------------------------------------------

    def run_once(self) -> int:
        """Lease what is due (up to `concurrency`), deliver it, wait; returns how many were attempted."""
        leased = self.lease(self.config.concurrency)
        for future in [self._pool.submit(self.deliver, item) for item in leased]:
            future.result()
        return len(leased)

    def run_forever(self, stop: threading.Event, poll_s: float = 1.0) -> None:
        """Keep up to `concurrency` deliveries in flight until `stop` is set; a slow receiver holds one
        slot for at most its timeouts, never the others or the dispatcher."""
        in_flight: set[Future[None]] = set()
        while not stop.is_set():
            in_flight = {f for f in in_flight if not f.done()}
            free = self.config.concurrency - len(in_flight)
            try:
                leased = self.lease(free) if free > 0 else []
            except Exception:
                log.exception("webhook lease failed; retrying")
                leased = []
            in_flight |= {self._pool.submit(self.deliver, item) for item in leased}
            if not leased:
                stop.wait(poll_s)
        self.close()

    # -- lease, send, record ------------------------------------------------------------------------

    def lease(self, limit: int) -> list[Leased]:
        """Take up to `limit` due rows (`due_in_turn`) and count their attempt, in one transaction."""
        now = utcnow()
        out: list[Leased] = []
        with self.sessions.begin() as session:
            stmt = due_in_turn(now, limit)
            if self._postgres:
                stmt = stmt.with_for_update(skip_locked=True, of=OutboxEntry)
            for row in session.scalars(stmt).unique():
                hook = row.webhook
                if hook.deleted_at is not None or hook.disabled_at is not None:
                    row.state, row.next_attempt_at, row.done_at = OutboxState.SKIPPED, None, now
                    continue
                row.attempts += 1
                row.lease_owner = self.config.owner
                row.lease_expires_at = now + timedelta(seconds=self.config.lease_s)
                out.append(Leased(
                    outbox_id=row.id, attempt=row.attempts, delivery_id="dlv_" + secrets.token_hex(12),
                    webhook_id=hook.id, event_id=row.event_id, event_type=str(row.payload.get("type", "")),
                    url=hook.url, format=hook.format, secrets=tuple(signing_secrets(hook, now)),
                    payload=dict(row.payload),
                    deadline=row.retry_from + timedelta(seconds=self.config.horizon_s)))
        return out

    def deliver(self, item: Leased) -> None:
        """Send one leased attempt and record it; never raises (a failure to record is logged, and
        the lease's expiry makes another attempt)."""
        try:
            failpoint("notify-before-send")
            answer = self.send(item)
            self.record(item, answer)
        except Exception:
            log.exception("webhook delivery %s of event %s failed", item.delivery_id, item.event_id)

    def send(self, item: Leased) -> Answer:
        body = render(item.payload, item.format)
        parts = urlsplit(item.url)
        try:
            addresses = check_address(parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80),
                                      allow_private=self.config.allow_private)
        except Unresolved as exc:  # a DNS outage is retried like a connection error
            return Answer(error=str(exc))
        except AddressRefused as exc:
            return Answer(error=str(exc), final_error=True)
        headers = {"Content-Type": "application/json", "Shardctl-Event-Id": str(item.event_id),
                   "Shardctl-Event-Type": item.event_type, "Shardctl-Delivery-Id": item.delivery_id,
                   signing.HEADER: signing.sign(item.secrets, int(time.time()), body)}
        # connect to an address just checked (in the resolver's order, the next one when one refuses the
        # connection), never to a new resolution of the name; with private addresses allowed, httpx resolves
        targets: list[str | None] = list(addresses) or [None]
        answer = Answer(error="no address to connect to")
        for address in targets:
            answer = self._post(item, body, headers, address)
            if not answer.connect_failed:
                break
        return answer

    def _post(self, item: Leased, body: bytes, headers: dict[str, str], address: str | None) -> Answer:
        url, extensions, sent = item.url, dict[str, str](), dict(headers)
        started = time.perf_counter()
        try:
            if address is not None:
                url, host_header, extensions = pinned(item.url, address)
                sent.update(host_header)
            with self.client.stream("POST", url, content=body, headers=sent, extensions=extensions) as response:
                excerpt = b""
                for chunk in response.iter_bytes():
                    excerpt += chunk
                    # the status is in; a body that trickles must not hold the row past its lease
                    if len(excerpt) >= EXCERPT_BYTES or time.perf_counter() - started > self.config.timeout_s:
                        break
                latency = (time.perf_counter() - started) * 1000
                return Answer(status=response.status_code, latency_ms=latency,
                              excerpt=excerpt[:EXCERPT_BYTES].decode("utf-8", "replace"),
                              retry_after=response.headers.get("retry-after"))
        except httpx.TimeoutException as exc:
            return Answer(latency_ms=(time.perf_counter() - started) * 1000,
                          error=f"timed out after {self.config.timeout_s:g} s ({type(exc).__name__})")
        except httpx.ConnectError as exc:
            return Answer(latency_ms=(time.perf_counter() - started) * 1000, connect_failed=True,
                          error=f"{type(exc).__name__}: {exc}" + (f" ({address})" if address else ""))
        except httpx.HTTPError as exc:
            return Answer(latency_ms=(time.perf_counter() - started) * 1000,
                          error=f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # a request that cannot even be made (never retried: it would fail again)
            return Answer(error=f"the request could not be made: {type(exc).__name__}: {exc}", final_error=True)

    def _outcome(self, item: Leased, answer: Answer, now: datetime) -> tuple[DeliveryOutcome, datetime | None]:
        """What came of the attempt, and when the next one is due (None: no next one)."""
        if answer.status is not None and 200 <= answer.status < 300:
            return DeliveryOutcome.DELIVERED, None
        if answer.status == GONE:
            return DeliveryOutcome.DISABLED, None
        if answer.final_error or (answer.status is not None and not is_retryable(answer.status)):
            return DeliveryOutcome.FAILED, None
        delay = backoff_s(item.attempt, base_s=self.config.retry_base_s, max_s=self.config.retry_max_s)
        asked = retry_after_s(answer.retry_after, now) if answer.status in (429, 503) else None
        if asked is not None:
            delay = max(delay, asked)
        due = now + timedelta(seconds=delay)
        return (DeliveryOutcome.GAVE_UP, None) if due > item.deadline else (DeliveryOutcome.RETRYING, due)

    def record(self, item: Leased, answer: Answer) -> DeliveryOutcome:
        """The attempt in the log, and what follows on its outbox row (if this worker still holds it)."""
        now = utcnow()
        outcome, due = self._outcome(item, answer, now)
        with self.sessions.begin() as session:
            session.add(Delivery(public_id=item.delivery_id, outbox_id=item.outbox_id, webhook_id=item.webhook_id,
                                 event_id=item.event_id, event_type=item.event_type, attempt=item.attempt,
                                 status_code=answer.status, latency_ms=answer.latency_ms,
                                 response_excerpt=answer.excerpt, error=answer.error, outcome=outcome, at=now))
            stmt = select(OutboxEntry).where(OutboxEntry.id == item.outbox_id)
            row = session.scalars(stmt.with_for_update(of=OutboxEntry) if self._postgres else stmt).first()
            if row is None or row.lease_owner != self.config.owner or row.attempts != item.attempt:
                log.warning("webhook delivery %s: the lease was lost before it was recorded", item.delivery_id)
                return outcome
            row.lease_owner = row.lease_expires_at = None
            if outcome == DeliveryOutcome.RETRYING:
                row.next_attempt_at = due
            else:
                row.state = OutboxState.DELIVERED if outcome == DeliveryOutcome.DELIVERED else OutboxState.FAILED
                row.next_attempt_at, row.done_at = None, now
            if outcome == DeliveryOutcome.DISABLED and row.webhook.disabled_at is None:
                row.webhook.disabled_at = now
                row.webhook.disabled_reason = f"the receiver answered 410 Gone to delivery {item.delivery_id}"
        log.info("webhook %s event %s attempt %s: %s (%s)", item.webhook_id, item.event_id, item.attempt, outcome,
                 answer.status if answer.status is not None else answer.error)
        return outcome

