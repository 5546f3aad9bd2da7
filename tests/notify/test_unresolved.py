"""A delivery whose host does not resolve now (a DNS outage) is retried like a connection error; a
host that resolves to a private address is refused for good."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from service.store.db import make_engine, make_sessionmaker
from service.store.notify_models import WebhookFormat
from workers.notify import Leased, Notifier, NotifierConfig


def leased(url: str) -> Leased:
    return Leased(outbox_id=1, attempt=1, delivery_id="d1", webhook_id=1, event_id=1, event_type="job.succeeded",
                  url=url, format=WebhookFormat.JSON, secrets=("s",), payload={"id": 1},
                  deadline=datetime.now(UTC) + timedelta(hours=1))


def test_an_unresolvable_host_is_retried_and_a_private_one_is_final(tmp_path: Path) -> None:
    sessions = make_sessionmaker(make_engine(f"sqlite:///{tmp_path / 'unused.db'}"))  # send reads no store
    notifier = Notifier(sessions, NotifierConfig(allow_private=False))
    try:
        outage = notifier.send(leased("https://no-such-host.invalid/hook"))
        assert outage.status is None and "does not resolve" in outage.error and not outage.final_error
        private = notifier.send(leased("http://127.0.0.1:9/hook"))
        assert private.final_error and "loopback" in private.error
    finally:
        notifier.close()
