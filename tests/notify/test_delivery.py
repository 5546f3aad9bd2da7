"""Webhook deliveries to a real receiver on loopback, on both databases: signatures, retries with the
same event id and new delivery ids, final 4xx, 410 disabling, redelivery, rotation, team scoping, and
a dispatcher killed between the state change and the delivery."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import select

from service.store.models import Event
from service.store.notify_models import OutboxEntry, OutboxState
from tests.db_fixtures import Env
from tests.notify.helpers import deliveries, notifier, pending, pump, submit, subscribe
from tests.notify.receiver import HANG, receiver
from workers.dispatch.context import FAILPOINT_ENV

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _loopback_allowed(env: Env) -> None:
    env.app.state.settings.webhook_allow_private = True  # the receiver is on 127.0.0.1


def _event_id(env: Env, job_id: int, kind: str) -> int:
    with env.app.state.sessions.begin() as session:
        return int(session.scalars(select(Event.id).where(Event.job_id == job_id, Event.kind == kind)).one())


def test_a_failing_receiver_gets_the_event_again_with_the_same_event_id(env: Env, admin: dict[str, str]) -> None:
    with receiver([500, 500, 200]) as rec:
        hook = subscribe(env, admin, rec.url, ["job.queued"])
        job_id = submit(env, admin)
        pump(notifier(env), env, rec, 3)
        got = rec.wait_for(3)
    assert len(got) == 3  # delivered once it answered 200, and not again
    event_id = _event_id(env, job_id, "job.queued")
    assert {r.event_id for r in got} == {str(event_id)}
    assert len({r.delivery_id for r in got}) == 3
    assert all(r.signed_by(hook["secret"]) for r in got)
    body = got[-1].json
    assert body["id"] == event_id and body["type"] == "job.queued" and body["team"] == "default"
    assert body["job"]["id"] == job_id and body["job"]["status"] == "QUEUED" and body["job"]["name"] == "tiny"
    assert {r.body for r in got} == {got[0].body}  # every attempt sends the same document
    log = deliveries(env, admin, hook["id"])
    assert [(d["attempt"], d["status_code"], d["outcome"]) for d in log] == [
        (3, 200, "delivered"), (2, 500, "retrying"), (1, 500, "retrying")]
    assert {d["id"] for d in log} == {r.delivery_id for r in got}
    assert all(d["latency_ms"] is not None and '"answered"' in d["response_excerpt"] for d in log)


def test_timeouts_and_429_are_retried_and_other_4xx_are_final(env: Env, admin: dict[str, str]) -> None:
    with receiver([(429, {"Retry-After": "0"}), 408, 400]) as rec:
        hook = subscribe(env, admin, rec.url, ["*"])
        submit(env, admin)
        worker = notifier(env)
        pump(worker, env, rec, 3)
        assert worker.run_once() == 0  # nothing left to send: the 400 was final
    assert len(rec.got) == 3
    assert [d["outcome"] for d in deliveries(env, admin, hook["id"])] == ["failed", "retrying", "retrying"]


def test_a_400_is_not_retried_and_can_be_redelivered(env: Env, admin: dict[str, str]) -> None:
    with receiver([400]) as rec:
        hook = subscribe(env, admin, rec.url, ["job.queued"])
        submit(env, admin)
        worker = notifier(env)
        pump(worker, env, rec, 1)
        assert worker.run_once() == 0 and len(rec.got) == 1
        [failed] = deliveries(env, admin, hook["id"])
        assert failed["outcome"] == "failed" and failed["status_code"] == 400
        r = env.client.post(f"/v1/webhooks/{hook['id']}/deliveries/{failed['id']}/redeliver", headers=admin)
        assert r.status_code == 202 and r.json()["state"] == "pending", r.text
        pump(worker, env, rec, 2)
    assert rec.got[1].event_id == rec.got[0].event_id and rec.got[1].delivery_id != rec.got[0].delivery_id
    assert [(d["attempt"], d["outcome"]) for d in deliveries(env, admin, hook["id"])] == [
        (2, "delivered"), (1, "failed")]


def test_a_410_disables_the_subscription(env: Env, admin: dict[str, str]) -> None:
    with receiver([410]) as rec:
        hook = subscribe(env, admin, rec.url, ["job.queued"])
        submit(env, admin)
        worker = notifier(env)
        pump(worker, env, rec, 1)
        shown = env.client.get(f"/v1/webhooks/{hook['id']}", headers=admin).json()
        assert shown["disabled_at"] is not None and "410" in shown["disabled_reason"]
        submit(env, admin, name="after")
        assert worker.run_once() == 0
    assert len(rec.got) == 1  # nothing more goes to a receiver that said it is gone
    assert deliveries(env, admin, hook["id"])[0]["outcome"] == "disabled"


def test_both_secrets_sign_during_the_rotation_grace_and_only_the_new_one_after(env: Env,
                                                                               admin: dict[str, str]) -> None:
    with receiver() as rec:
        hook = subscribe(env, admin, rec.url, ["job.queued"])
        old = hook["secret"]
        worker = notifier(env)
        rotated = env.client.post(f"/v1/webhooks/{hook['id']}/rotate", headers=admin)
        assert rotated.status_code == 200, rotated.text
        new = rotated.json()["secret"]
        assert new != old and rotated.json()["previous_secret_expires_at"] is not None
        submit(env, admin, name="during")
        pump(worker, env, rec, 1)
        during = rec.got[0]
        assert during.signed_by(new) and during.signed_by(old)  # a receiver on either secret accepts it
        env.app.state.settings.webhook_secret_grace_s = 0  # the next rotation's grace is over at once
        newest = env.client.post(f"/v1/webhooks/{hook['id']}/rotate", headers=admin).json()["secret"]
        submit(env, admin, name="after")
        pump(worker, env, rec, 2)
        after = rec.got[1]
    assert after.signed_by(newest) and not after.signed_by(new) and not after.signed_by(old)


def test_a_slack_subscription_gets_a_text_message(env: Env, admin: dict[str, str]) -> None:
    with receiver() as rec:
        subscribe(env, admin, rec.url, ["job.cancelled"], format="slack")
        job_id = submit(env, admin)
        assert env.client.post(f"/v1/jobs/{job_id}/cancel", headers=admin).status_code == 200
        pump(notifier(env), env, rec, 1)
    [got] = rec.got
    assert set(got.json) == {"text"} and f"job {job_id}" in got.json["text"] and "job.cancelled" in got.json["text"]


def test_a_team_subscription_gets_only_its_teams_events(env: Env, admin: dict[str, str]) -> None:
    member = env.headers(env.token("member", team="alpha"))
    other = env.headers(env.token("member", team="beta"))
    with receiver() as rec:
        subscribe(env, member, rec.url, ["*"])
        submit(env, other, name="theirs")
        ours = submit(env, member, name="ours")
        pump(notifier(env), env, rec, 1)
    assert [r.json["job"]["id"] for r in rec.got] == [ours]


def test_a_deleted_subscription_gets_nothing_more(env: Env, admin: dict[str, str]) -> None:
    with receiver() as rec:
        hook = subscribe(env, admin, rec.url, ["job.queued"])
        submit(env, admin)
        assert env.client.delete(f"/v1/webhooks/{hook['id']}", headers=admin).status_code == 204
        assert notifier(env).run_once() == 0
    assert rec.got == []
    with env.app.state.sessions.begin() as session:
        assert list(session.scalars(select(OutboxEntry))) == []  # never attempted: dropped with it


def test_a_disabled_subscriptions_pending_deliveries_are_skipped(env: Env, admin: dict[str, str]) -> None:
    with receiver([410]) as rec:
        subscribe(env, admin, rec.url, ["job.queued"])
        submit(env, admin, name="first")
        submit(env, admin, name="second")
        worker = notifier(env, concurrency=1)
        assert worker.run_once() == 1  # 410: disabled
        assert worker.run_once() == 0
    assert len(rec.got) == 1
    with env.app.state.sessions.begin() as session:
        assert [row.state for row in session.scalars(select(OutboxEntry).order_by(OutboxEntry.id))] == [
            OutboxState.FAILED, OutboxState.SKIPPED]


@pytest.mark.slow
def test_a_dispatcher_killed_after_the_commit_delivers_after_restart(env: Env, admin: dict[str, str],
                                                                     tmp_path: Path) -> None:
    """SIGKILL right after the SUBMITTING transition commits (the dispatcher's failpoint): the event
    and its outbox row are in the database, nothing was sent; the next process delivers it."""
    worker_env = {**os.environ, "SHARDCTL_DATABASE_URL": env.url, "SHARDCTL_DATA_DIR": str(tmp_path),
                  "SHARDCTL_WEBHOOK_ALLOW_PRIVATE": "1", "SHARDCTL_WEBHOOK_RETRY_BASE_S": "0.01"}
    with receiver() as rec:
        hook = subscribe(env, admin, rec.url, ["job.submitting"])
        job_id = submit(env, admin)
        crash = subprocess.run([sys.executable, "-m", "service.cli.main", "worker", "--once"], cwd=ROOT, timeout=120,
                               env={**worker_env, FAILPOINT_ENV: "after-submitting-commit"},
                               capture_output=True, text=True)
        assert crash.returncode == -9, crash.stderr  # SIGKILL at the failpoint
        assert rec.got == []
        with env.app.state.sessions.begin() as session:
            [row] = session.scalars(select(OutboxEntry))
            assert row.state == OutboxState.PENDING and row.attempts == 0
        # Restart: the job's lease (60 s) has not run out, so this dispatcher leaves the job alone and
        # only the delivery worker has work.
        again = subprocess.run([sys.executable, "-m", "service.cli.main", "worker", "--once"], cwd=ROOT,
                               timeout=120, env=worker_env, capture_output=True, text=True)
        assert again.returncode == 0, again.stderr
        got = rec.wait_for(1)
    assert len(got) == 1 and got[0].signed_by(hook["secret"])
    assert got[0].event_id == str(_event_id(env, job_id, "job.submitting"))


def test_a_delivery_worker_killed_before_sending_delivers_after_its_lease_runs_out(
        env: Env, admin: dict[str, str], tmp_path: Path) -> None:
    """SIGKILL after the attempt's lease committed and before the POST (the delivery worker's own
    failpoint): once the lease runs out, another worker makes the next attempt."""
    worker_env = {**os.environ, "SHARDCTL_DATABASE_URL": env.url, "SHARDCTL_DATA_DIR": str(tmp_path),
                  "SHARDCTL_WEBHOOK_ALLOW_PRIVATE": "1", "SHARDCTL_WEBHOOK_TIMEOUT_S": "0.2",
                  FAILPOINT_ENV: "notify-before-send"}
    with receiver() as rec:
        hook = subscribe(env, admin, rec.url, ["job.cancelled"])
        job_id = submit(env, admin)  # cancelled while queued: no dispatcher work, only the event
        assert env.client.post(f"/v1/jobs/{job_id}/cancel", headers=admin).status_code == 200
        crash = subprocess.run([sys.executable, "-m", "service.cli.main", "worker", "--once"], cwd=ROOT, timeout=120,
                               env=worker_env, capture_output=True, text=True)
        assert crash.returncode == -9, crash.stderr
        assert rec.got == []
        with env.app.state.sessions.begin() as session:
            [row] = session.scalars(select(OutboxEntry))
            assert row.attempts == 1 and row.lease_owner is not None  # leased, counted, never sent
        pump(notifier(env, timeout_s=0.2), env, rec, 1, timeout_s=60)  # waits out the dead worker's lease
    [got] = rec.got
    assert got.signed_by(hook["secret"]) and got.event_id == str(_event_id(env, job_id, "job.cancelled"))
    assert [d["attempt"] for d in deliveries(env, admin, hook["id"])] == [2]


def test_a_receiver_that_hangs_times_out_and_is_tried_again(env: Env, admin: dict[str, str]) -> None:
    with receiver([HANG]) as rec:
        hook = subscribe(env, admin, rec.url, ["job.queued"])
        submit(env, admin)
        pump(notifier(env, timeout_s=0.3), env, rec, 2)
    assert len({r.event_id for r in rec.got}) == 1
    second, first = deliveries(env, admin, hook["id"])
    assert first["outcome"] == "retrying" and first["status_code"] is None and "timed out" in first["error"]
    assert second["outcome"] == "delivered"


def test_two_delivery_workers_never_send_the_same_attempt(env: Env, admin: dict[str, str]) -> None:
    """Two workers (as in two dispatcher replicas) drain one outbox at once: each event arrives once,
    as attempt 1 (PostgreSQL: FOR UPDATE SKIP LOCKED; SQLite: one writer at a time)."""
    with receiver() as rec:
        subscribe(env, admin, rec.url, ["job.queued"])
        jobs = [submit(env, admin, name=f"j{i}") for i in range(30)]
        workers = [notifier(env, concurrency=4), notifier(env, concurrency=4)]
        workers[1].config.owner += "-replica"
        stop = threading.Event()
        threads = [threading.Thread(target=w.run_forever, args=(stop, 0.01)) for w in workers]
        for t in threads:
            t.start()
        try:
            got = rec.wait_for(30)
            deadline = time.monotonic() + 30
            while pending(env) and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=30)
    assert sorted(r.json["job"]["id"] for r in got) == sorted(jobs) and len(rec.got) == 30
    with env.app.state.sessions.begin() as session:
        assert {row.attempts for row in session.scalars(select(OutboxEntry))} == {1}


def test_a_retry_after_is_honoured(env: Env, admin: dict[str, str]) -> None:
    with receiver([(429, {"Retry-After": "3600"})]) as rec:
        hook = subscribe(env, admin, rec.url, ["job.queued"])
        submit(env, admin)
        worker = notifier(env)
        worker.run_once()
        assert worker.run_once() == 0 and len(rec.got) == 1  # not due again for an hour
    [first] = deliveries(env, admin, hook["id"])
    with env.app.state.sessions.begin() as session:
        [row] = session.scalars(select(OutboxEntry))
        assert row.state == OutboxState.PENDING
        assert (row.next_attempt_at - datetime.fromisoformat(first["at"])).total_seconds() >= 3600


def test_retries_stop_at_the_horizon(env: Env, admin: dict[str, str]) -> None:
    with receiver([500] * 1000) as rec:
        hook = subscribe(env, admin, rec.url, ["job.queued"])
        submit(env, admin)
        worker = notifier(env, horizon_s=0.3, retry_base_s=0.05, retry_max_s=0.1)
        pump(worker, env, rec, 1)
        assert worker.run_once() == 0
    outcomes = [d["outcome"] for d in deliveries(env, admin, hook["id"])]
    assert outcomes[0] == "gave_up" and set(outcomes[1:]) <= {"retrying"} and len(outcomes) == len(rec.got)
    with env.app.state.sessions.begin() as session:
        assert [row.state for row in session.scalars(select(OutboxEntry))] == [OutboxState.FAILED]
