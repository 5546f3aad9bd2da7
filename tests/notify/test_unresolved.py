"""A delivery whose host does not resolve now (a DNS outage) is retried like a connection error; a
host that resolves to a private address is refused for good."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from service.notify import addresses
from service.store.db import make_engine, make_sessionmaker
from service.store.notify_models import WebhookFormat
from tests.notify.receiver import receiver
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


@pytest.fixture
def public_notifier(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Notifier]:
    """A notifier that refuses private addresses, with every address deemed public (the tests' receivers
    listen on loopback)."""
    monkeypatch.setattr(addresses, "_refused_ip", lambda ip: None)
    notifier = Notifier(make_sessionmaker(make_engine(f"sqlite:///{tmp_path / 'unused.db'}")),
                        NotifierConfig(allow_private=False))
    yield notifier
    notifier.close()


def test_a_delivery_connects_to_the_address_it_checked_not_to_a_new_lookup(public_notifier: Notifier,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """DNS rebinding: a name that resolves to an allowed address when checked and elsewhere when the
    HTTP client looks it up again must be sent to the address checked. Here the check resolves
    `hooks.rebind.invalid` to the receiver's address (deemed public for this test) and nothing else can
    resolve that name at all: the delivery arrives only if it was sent to the checked address."""
    monkeypatch.setattr(addresses, "resolve",
                        lambda host, port: ["127.0.0.1"] if host == "hooks.rebind.invalid" else [])
    with receiver() as hook:
        port = urlsplit(hook.url).port
        answer = public_notifier.send(leased(f"http://hooks.rebind.invalid:{port}/hook"))
        assert answer.status == 200, answer
        got = hook.wait_for(1)
        assert got[0].headers["host"] == f"hooks.rebind.invalid:{port}"  # the name, for virtual hosts


def test_pinned_keeps_the_name_for_host_and_tls() -> None:
    url, headers, extensions = addresses.pinned("https://hooks.example.com/x?y=1", "93.184.216.34")
    assert (url, headers, extensions) == ("https://93.184.216.34/x?y=1", {"Host": "hooks.example.com"},
                                          {"sni_hostname": "hooks.example.com"})
    url, headers, extensions = addresses.pinned("http://hooks.example.com:8080/x", "2606:2800:220:1::1")
    assert (url, headers, extensions) == ("http://[2606:2800:220:1::1]:8080/x", {"Host": "hooks.example.com:8080"}, {})


def test_every_checked_address_is_tried_in_order_and_an_idna_host_is_sent(public_notifier: Notifier,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A receiver with two addresses, the first refusing connections (a dual-stack name on a machine
    without that route), is reached on the second; an internationalised name travels as IDNA."""
    with receiver() as hook:
        port = urlsplit(hook.url).port
        # the receiver listens on 127.0.0.1 only: on 127.0.0.2, its port refuses connections
        monkeypatch.setattr(addresses, "resolve", lambda host, p: ["127.0.0.2", "127.0.0.1"])
        answer = public_notifier.send(leased(f"http://bücher.rebind.invalid:{port}/hook"))
        assert answer.status == 200, answer
        assert hook.wait_for(1)[0].headers["host"] == f"xn--bcher-kva.rebind.invalid:{port}"
