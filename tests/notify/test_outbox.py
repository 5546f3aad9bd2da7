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
from tests.specs import tiny


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


def test_a_batch_writes_each_job_queued_delivery_its_teams_subscriptions_get(env: Env, admin: dict[str, str]) -> None:
    """One batch into three teams: alpha has a subscription of its own, beta one that was deleted, the
    default team none; a subscription to every team gets every job. The submission reads each team's
    subscriptions along with the team, and a team found without any gets no delivery."""
    for team in ("alpha", "beta"):
        assert env.client.post("/v1/teams", json={"name": team}, headers=admin).status_code == 201
    alpha = subscribe(env, admin, "http://127.0.0.1:9/alpha", ["job.queued"], team="alpha")
    gone = subscribe(env, admin, "http://127.0.0.1:9/beta", ["*"], team="beta")
    assert env.client.delete(f"/v1/webhooks/{gone['id']}", headers=admin).status_code == 204
    specs = [tiny(name="a", team="alpha"), tiny(name="b", team="beta"), tiny(name="d")]
    r = env.client.post("/v1/jobs:batch", json={"specs": specs}, headers=admin)
    assert r.status_code == 201, r.text
    ids = {job["name"]: job["id"] for job in r.json()["items"]}

    def delivered() -> list[tuple[str, int]]:
        with env.app.state.sessions.begin() as session:
            rows = session.execute(select(Webhook.public_id, Event.job_id).select_from(OutboxEntry)
                                   .join(Event, Event.id == OutboxEntry.event_id)
                                   .join(Webhook, Webhook.id == OutboxEntry.webhook_id).order_by(OutboxEntry.id)).all()
        return [(hook, job_id) for hook, job_id in rows]

    assert delivered() == [(alpha["id"], ids["a"])]
    every = subscribe(env, admin, "http://127.0.0.1:9/all", ["job.queued"])
    r = env.client.post("/v1/jobs:batch", json={"specs": [tiny(name="a2", team="alpha"), tiny(name="d2")]},
                        headers=admin)
    assert r.status_code == 201, r.text
    again = {job["name"]: job["id"] for job in r.json()["items"]}
    assert sorted(delivered()[1:]) == sorted([(alpha["id"], again["a2"]), (every["id"], again["a2"]),
                                              (every["id"], again["d2"])])
    with env.app.state.sessions.begin() as session:
        payloads = {row.event_id: row.payload for row in session.scalars(select(OutboxEntry))}
        queued = {e.job_id: e.id for e in session.scalars(select(Event).where(Event.kind == "job.queued"))}
    body = payloads[queued[again["d2"]]]
    assert body["type"] == "job.queued" and body["team"] == "default" and body["id"] == queued[again["d2"]]
    assert body["job"] == {"id": again["d2"], "name": "d2", "status": "QUEUED", "team": "default",
                           "backend": "local", "priority": 0}
