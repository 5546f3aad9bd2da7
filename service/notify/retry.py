"""When a failed delivery is tried again: which answers are worth another attempt, and how long to
wait (exponential backoff with jitter, capped; a receiver's `Retry-After` is honoured)."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

#: Statuses a later attempt may succeed at (besides every 5xx, timeouts and connection errors).
RETRYABLE_STATUSES = frozenset({408, 429})
GONE = 410


def is_retryable(status: int) -> bool:
    return status >= 500 or status in RETRYABLE_STATUSES


def backoff_s(attempt: int, *, base_s: float, max_s: float, rng: random.Random | None = None) -> float:
    """The wait after failed attempt number `attempt` (1-based): base * 2**(attempt-1), capped at
    `max_s`, times a random factor in [0.5, 1) so that receivers recovering from an outage are not
    hit by every retry at once."""
    ceiling = min(max_s, base_s * 2.0 ** min(attempt - 1, 62))
    return ceiling * (0.5 + 0.5 * (rng or random).random())


def retry_after_s(value: str | None, now: datetime) -> float | None:
    """Seconds a `Retry-After` header asks for (delta seconds or an HTTP date); None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    when = when if when.tzinfo is not None else when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())
