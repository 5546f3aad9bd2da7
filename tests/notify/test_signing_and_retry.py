"""What receivers and the retry schedule depend on: a signature verifies only for its body, secret and a
recent timestamp; waits double with jitter up to the cap; Retry-After is read in both of its forms."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

from service.notify.retry import backoff_s, is_retryable, retry_after_s
from service.notify.signing import sign, verify

BODY = b'{"id":1,"type":"job.failed"}'


def test_a_signature_verifies_only_for_its_body_secret_and_a_recent_time() -> None:
    now = 1_800_000_000
    header = sign(["new", "old"], now, BODY)
    assert header.startswith(f"t={now},v1=") and header.count("v1=") == 2
    assert verify(header, "new", BODY, now=now) and verify(header, "old", BODY, now=now + 299)
    assert not verify(header, "other", BODY, now=now)
    assert not verify(header, "new", BODY + b" ", now=now)  # the body was changed on the way
    assert not verify(header, "new", BODY, now=now + 301)  # replayed later than the tolerance
    assert not verify(header.replace(f"t={now}", f"t={now + 1}"), "new", BODY, now=now)  # the time was changed
    assert not verify("v1=abc", "new", BODY, now=now)


def test_waits_double_with_jitter_up_to_the_cap() -> None:
    rng = random.Random(7)
    for attempt in range(1, 30):
        ceiling = min(60.0, 2.0 * 2 ** (attempt - 1))
        wait = backoff_s(attempt, base_s=2.0, max_s=60.0, rng=rng)
        assert ceiling / 2 <= wait < ceiling
    assert backoff_s(10_000, base_s=2.0, max_s=60.0) < 60.0  # no overflow far down the schedule


def test_which_answers_are_retried() -> None:
    assert all(is_retryable(s) for s in (500, 502, 503, 504, 408, 429))
    assert not any(is_retryable(s) for s in (400, 401, 403, 404, 410, 422, 301))


def test_retry_after_in_seconds_or_as_a_date() -> None:
    now = datetime(2026, 12, 1, tzinfo=UTC)
    assert retry_after_s("120", now) == 120.0
    assert retry_after_s(format_datetime(now + timedelta(seconds=90), usegmt=True), now) == 90.0
    assert retry_after_s("soon", now) is None and retry_after_s(None, now) is None
