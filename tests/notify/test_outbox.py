"""The outbox is written in the transaction that writes the event, on both databases: both commit, or
neither does; one row per matching live subscription, however many events the transaction writes."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from service.store.models import Event, Job
from service.store.notify_models import OutboxEntry, Webhook
from service.store.states import add_event, transition
from service.store.vocab import JobStatus
from tests.db_fixtures import Env
from tests.notify.helpers import submit, subscribe


@pytest.fixture(autouse=True)
def _loopback_allowed(env: Env) -> None:
    env.app.state.settings.webhook_allow_private = True


def _count(env: Env, model: type) -> int:
    with env.app.state.sessions.begin() as session:
        return int(session.scalar(select(func.count()).select_from(model)))


def test_a_rolled_back_transition_leaves_no_event_and_no_delivery(env: Env, admin: dict[str, str]) -> None:
    subscribe(env, admin, "http://127.0.0.1:9/hook", ["job.cancelled"])
    job_id = submit(env, admin)
    events = _count(env, Event)
    with pytest.raises(RuntimeError), env.app.state.sessions.begin() as session:
        transition(session, session.get(Job, job_id), JobStatus.CANCELLED, actor="test")
        session.flush()
        assert session.scalar(select(func.count()).select_from(OutboxEntry)) == 1  # written, not committed
        raise RuntimeError("crash before commit")
    assert _count(env, Event) == events and _count(env, OutboxEntry) == 0


def test_each_event_of_a_transaction_gets_a_row_per_matching_subscription(env: Env, admin: dict[str, str]) -> None:
    every = subscribe(env, admin, "http://127.0.0.1:9/all", ["*"])
    failures = subscribe(env, admin, "http://127.0.0.1:9/failed", ["job.failed"])
    job_id = submit(env, admin)  # job.queued: the "*" subscription only
    with env.app.state.sessions.begin() as session:
        job = session.get(Job, job_id)
        transition(session, job, JobStatus.SUBMITTING, actor="test")
        add_event(session, job, actor="test", kind="job.requeued", message="a note")
        transition(session, job, JobStatus.FAILED, actor="test")
    with env.app.state.sessions.begin() as session:
        rows = session.execute(select(Webhook.public_id, Event.kind).select_from(OutboxEntry)
                               .join(Event, Event.id == OutboxEntry.event_id)
                               .join(Webhook, Webhook.id == OutboxEntry.webhook_id).order_by(OutboxEntry.id)).all()
    assert [(hook, kind) for hook, kind in rows if hook == every["id"]] == [
        (every["id"], kind) for kind in ("job.queued", "job.submitting", "job.requeued", "job.failed")]
    assert [kind for hook, kind in rows if hook == failures["id"]] == ["job.failed"]
