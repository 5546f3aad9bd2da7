"""A backlog of one subscription neither holds back another's deliveries nor outlives its deletion, on
both databases: a lease takes due deliveries round-robin across subscriptions (counting those already
in flight), and deleting a subscription drops its pending deliveries in the deleting transaction."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from service.store.models import Job
from service.store.notify_models import Delivery, DeliveryOutcome, OutboxEntry, OutboxState, Webhook
from service.store.states import add_event
from service.store.tokens import Principal
from service.store.vocab import EventKind, Role
from service.store.webhooks import delete_webhook
from tests.db_fixtures import Env
from tests.notify.helpers import notifier, submit, subscribe
from workers.notify import Answer, Leased, Notifier

BACKLOG = 500


@pytest.fixture(autouse=True)
def _loopback_allowed(env: Env) -> None:
    env.app.state.settings.webhook_allow_private = True


def _internal_id(env: Env, public_id: str) -> int:
    with env.app.state.sessions.begin() as session:
        return int(session.scalars(select(Webhook.id).where(Webhook.public_id == public_id)).one())


def _add_notes(env: Env, job_id: int, count: int) -> None:
    """`count` more events of job `job_id`, each enqueued for its subscriptions by the store."""
    with env.app.state.sessions.begin() as session:
        job = session.get(Job, job_id)
        assert job is not None
        for i in range(count):
            add_event(session, job, actor="test", kind=EventKind.REQUEUED, message=f"note {i}")


def _team_with_backlog(env: Env, team: str, count: int) -> tuple[dict[str, str], int, int]:
    """A member of `team`, its subscription to every event (internal id) and a job of the team with
    `count` pending deliveries (its job.queued and notes)."""
    member = env.headers(env.token("member", team=team))
    hook = subscribe(env, member, f"http://127.0.0.1:9/{team}", ["*"])
    job_id = submit(env, member, name=f"{team}-job")
    _add_notes(env, job_id, count - 1)
    return member, _internal_id(env, hook["id"]), job_id


def _outbox(env: Env, webhook_id: int) -> list[OutboxEntry]:
    with env.app.state.sessions.begin() as session:
        return list(session.scalars(select(OutboxEntry).where(OutboxEntry.webhook_id == webhook_id)
                                    .order_by(OutboxEntry.id)))


def _leased_rows(worker: Notifier, limit: int) -> list[tuple[int, int]]:
    """(webhook id, outbox id) of each delivery one lease of up to `limit` takes, in the lease's order."""
    return [(item.webhook_id, item.outbox_id) for item in worker.lease(limit)]


def test_a_new_subscription_is_served_in_the_next_lease_behind_another_ones_backlog(env: Env) -> None:
    _, alpha, _ = _team_with_backlog(env, "alpha", BACKLOG)
    _, beta, _ = _team_with_backlog(env, "beta", 1)
    oldest_alpha = [row.id for row in _outbox(env, alpha)][:3]
    [beta_row] = [row.id for row in _outbox(env, beta)]
    worker = notifier(env)
    try:
        # each subscription's oldest first, then each one's second oldest, ...; alpha's is older
        assert _leased_rows(worker, 4) == [(alpha, oldest_alpha[0]), (beta, beta_row),
                                           (alpha, oldest_alpha[1]), (alpha, oldest_alpha[2])]
    finally:
        worker.close()


def test_deliveries_in_flight_count_towards_their_subscriptions_turn(env: Env) -> None:
    """A worker with one free slot gives it to the subscription with the fewest deliveries in flight,
    though the other's next one is older."""
    _, alpha, _ = _team_with_backlog(env, "alpha", BACKLOG)
    oldest_alpha = [row.id for row in _outbox(env, alpha)][:4]
    worker = notifier(env)
    try:
        assert _leased_rows(worker, 3) == [(alpha, row) for row in oldest_alpha[:3]]
        _, beta, _ = _team_with_backlog(env, "beta", 2)
        beta_rows = [row.id for row in _outbox(env, beta)]
        assert _leased_rows(worker, 1) == [(beta, beta_rows[0])]
        assert _leased_rows(worker, 1) == [(beta, beta_rows[1])]
        assert _leased_rows(worker, 1) == [(alpha, oldest_alpha[3])]
    finally:
        worker.close()


def _deleted_with_history(env: Env) -> tuple[Notifier, int, int, Leased, Leased]:
    """Team alpha's subscription with 5 pending deliveries: one tried once and due again later, one in
    flight, three never tried; team beta's with one never tried. Returns a worker (no retry due soon),
    alpha's and beta's ids, and the attempts made of alpha's first two."""
    _, alpha, _ = _team_with_backlog(env, "alpha", 5)
    worker = notifier(env, retry_base_s=3600, retry_max_s=3600)
    [tried] = worker.lease(1)
    assert worker.record(tried, Answer(status=500)) == DeliveryOutcome.RETRYING
    [in_flight] = worker.lease(1)
    assert (tried.webhook_id, in_flight.webhook_id) == (alpha, alpha)
    _, beta, _ = _team_with_backlog(env, "beta", 1)
    return worker, alpha, beta, tried, in_flight


def test_deleting_a_subscription_drops_its_pending_deliveries_and_keeps_its_log(env: Env,
                                                                                admin: dict[str, str]) -> None:
    worker, alpha, beta, tried, in_flight = _deleted_with_history(env)
    try:
        with env.app.state.sessions.begin() as session:
            public_id = session.scalars(select(Webhook.public_id).where(Webhook.id == alpha)).one()
        assert env.client.delete(f"/v1/webhooks/{public_id}", headers=admin).status_code == 204
        # the two attempted stay (the deliveries log names them), closed; the never attempted are gone
        rows = _outbox(env, alpha)
        assert [row.id for row in rows] == [tried.outbox_id, in_flight.outbox_id]
        assert all(row.state == OutboxState.SKIPPED and row.next_attempt_at is None and row.done_at is not None
                   and row.lease_owner is None and row.lease_expires_at is None for row in rows)
        [other] = _outbox(env, beta)
        assert other.state == OutboxState.PENDING and other.next_attempt_at is not None and other.attempts == 0

        # the attempt in flight when it was deleted is logged, and schedules nothing more
        assert worker.record(in_flight, Answer(status=500)) == DeliveryOutcome.RETRYING
        assert [(row.state, row.next_attempt_at) for row in _outbox(env, alpha)] == [(OutboxState.SKIPPED, None)] * 2
        with env.app.state.sessions.begin() as session:
            log = session.execute(select(Delivery.outbox_id, Delivery.attempt).where(Delivery.webhook_id == alpha)
                                  .order_by(Delivery.id)).all()
        assert [tuple(row) for row in log] == [(tried.outbox_id, 1), (in_flight.outbox_id, 1)]
        assert _leased_rows(worker, 8) == [(beta, other.id)]
    finally:
        worker.close()


def test_pending_deliveries_are_dropped_in_the_deleting_transaction(env: Env) -> None:
    worker, alpha, _, _, _ = _deleted_with_history(env)
    worker.close()
    before = [(row.id, row.state, row.next_attempt_at) for row in _outbox(env, alpha)]
    with env.app.state.sessions.begin() as session:
        public_id = session.scalars(select(Webhook.public_id).where(Webhook.id == alpha)).one()
    with pytest.raises(RuntimeError), env.app.state.sessions.begin() as session:
        delete_webhook(session, Principal(token_id="test", role=Role.ADMIN), public_id)
        session.flush()
        pending = session.scalars(select(OutboxEntry.id).where(OutboxEntry.webhook_id == alpha,
                                                               OutboxEntry.next_attempt_at.is_not(None)))
        assert list(pending) == []
        raise RuntimeError("crash before commit")
    assert [(row.id, row.state, row.next_attempt_at) for row in _outbox(env, alpha)] == before
