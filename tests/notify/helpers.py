"""Shared steps of the webhook tests: subscribe, submit, run the delivery worker until a receiver has
what it should."""

from __future__ import annotations

import time
from typing import Any

from service.store.notify_models import OutboxEntry
from tests.db_fixtures import Env
from tests.notify.receiver import Receiver
from tests.specs import tiny
from workers.notify import Notifier, NotifierConfig


def subscribe(env: Env, headers: dict[str, str], url: str, events: list[str], **extra: Any) -> dict[str, Any]:
    r = env.client.post("/v1/webhooks", json={"url": url, "events": events, **extra}, headers=headers)
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


def submit(env: Env, headers: dict[str, str], **spec: Any) -> int:
    r = env.client.post("/v1/jobs", json=tiny(**spec), headers=headers)
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def notifier(env: Env, **config: Any) -> Notifier:
    """A delivery worker on the env's database with a small backoff, so that retries come fast."""
    defaults: dict[str, Any] = {"retry_base_s": 0.01, "retry_max_s": 0.05, "allow_private": True, "timeout_s": 5}
    return Notifier(env.app.state.sessions, NotifierConfig(**{**defaults, **config}))


def pending(env: Env) -> int:
    with env.app.state.sessions.begin() as session:
        return sum(1 for row in session.query(OutboxEntry) if row.next_attempt_at is not None)


def pump(worker: Notifier, env: Env, receiver: Receiver | None = None, count: int = 0,
         timeout_s: float = 30.0) -> None:
    """Run delivery rounds until the receiver has `count` requests and nothing is pending any more."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        worker.run_once()
        if (receiver is None or len(receiver.got) >= count) and pending(env) == 0:
            return
        time.sleep(0.02)
    raise AssertionError(f"deliveries still pending after {timeout_s} s "
                         f"(received {len(receiver.got) if receiver else '-'}, wanted {count})")


def deliveries(env: Env, headers: dict[str, str], hook_id: str) -> list[dict[str, Any]]:
    r = env.client.get(f"/v1/webhooks/{hook_id}/deliveries", headers=headers)
    assert r.status_code == 200, r.text
    return r.json()["items"]  # type: ignore[no-any-return]
