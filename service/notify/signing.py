"""Delivery signatures, as Stripe makes them: `Shardctl-Signature: t=<unix seconds>,v1=<hex>` where
the hex is HMAC-SHA256(secret, "<t>.<body>"). During a secret's rotation a delivery carries one `v1`
per valid secret (the new one first); a receiver accepts the delivery if any of them verifies with
the secret it knows, and refuses timestamps too far from its clock (replays)."""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Sequence

HEADER = "Shardctl-Signature"
#: How far a receiver should let a delivery's timestamp be from its clock (Stripe's default).
DEFAULT_TOLERANCE_S = 300


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """hex HMAC-SHA256(secret, "<timestamp>.<body>")."""
    return hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def sign(secrets: Sequence[str], timestamp: int, body: bytes) -> str:
    """The header value for `body` sent at `timestamp`: `t=...` and one `v1=...` per secret."""
    return ",".join([f"t={timestamp}", *(f"v1={signature(s, timestamp, body)}" for s in secrets)])


def verify(header: str, secret: str, body: bytes, *, tolerance_s: float = DEFAULT_TOLERANCE_S,
           now: float | None = None) -> bool:
    """True when `header` holds a `v1` signature of `body` by `secret` and a timestamp within
    `tolerance_s` of `now` (what a receiver does; docs/notifications.md shows it standalone)."""
    fields = [part.partition("=") for part in header.split(",")]
    stamps = [value for key, _, value in fields if key.strip() == "t"]
    if len(stamps) != 1 or not stamps[0].isdigit():
        return False
    timestamp = int(stamps[0])
    if abs((time.time() if now is None else now) - timestamp) > tolerance_s:
        return False
    expected = signature(secret, timestamp, body)
    return any(key.strip() == "v1" and hmac.compare_digest(value.strip(), expected) for key, _, value in fields)
