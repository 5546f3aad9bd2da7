"""A token checked inside the statement that reads the answer, instead of in a statement of its own.

What a token is (its id, its secret's hash, its role, team and job) never changes once it is created;
whether it works (revocation, expiry, its job's end) can change at any moment. `KnownTokens` keeps the
first kind for the tokens this process has authenticated, so a request knows who is asking before
its statement runs; `TOKEN_LIVE` is the second kind as a condition that the statement carries, with
the same rules as `tokens.authenticate`.

A row that such a statement returns proves the token worked when the statement ran. No row proves
nothing (the token may have stopped working, or there is simply nothing to show): the store raises
`Unproven`, and the caller authenticates the token in full and goes again.
"""

from __future__ import annotations

import hmac
import threading
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, bindparam, exists, or_

from service.store.models import ApiToken, Job
from service.store.tokens import Principal, secret_hash, split_bearer
from service.store.vocab import Role

#: The bind parameters `TOKEN_LIVE` reads (`live_values` gives them).
LIVE_TOKEN, LIVE_NOW, LIVE_ENDED_BY = "live_token", "live_now", "live_ended_by"

#: The values of `TOKEN_LIVE`'s bind parameters by name (`live_values`), merged into the parameters of
#: the statement that carries it. Where a store function takes one (`live=`), its principal came from
#: `KnownTokens` and its statement checks the token; None: the token was authenticated already.
LiveValues = dict[str, Any]


class Unproven(Exception):
    """A statement carrying `TOKEN_LIVE` returned no rows, so it says nothing of the token: authenticate
    it (`tokens.authenticate`) and go again."""


def _token_live() -> ColumnElement[bool]:
    tokens = ApiToken.__table__
    token_job = Job.__table__.alias("token_job")
    ended = (exists().where(token_job.c.id == tokens.c.job_id,
                            token_job.c.finished_at <= bindparam(LIVE_ENDED_BY, type_=token_job.c.finished_at.type))
             .correlate(tokens))
    return (exists().where(tokens.c.id == bindparam(LIVE_TOKEN),
                           tokens.c.revoked_at.is_(None),
                           or_(tokens.c.expires_at.is_(None),
                               tokens.c.expires_at > bindparam(LIVE_NOW, type_=tokens.c.expires_at.type)),
                           or_(tokens.c.role != Role.JOB, ~ended))
            .correlate_except(tokens))


#: `authenticate`'s rules as one condition, on no table of the statement it is added to: the token
#: `LIVE_TOKEN` is not revoked, has not expired by `LIVE_NOW`, and, a job token, its job has not
#: ended by `LIVE_ENDED_BY` (`LIVE_NOW` less the grace after a job's end).
TOKEN_LIVE = _token_live()


def live_values(principal: Principal, now: datetime, job_token_grace_s: float) -> LiveValues:
    """The values of `TOKEN_LIVE`'s bind parameters for `principal`'s token at `now`."""
    return {LIVE_TOKEN: principal.token_id, LIVE_NOW: now,
            LIVE_ENDED_BY: now - timedelta(seconds=job_token_grace_s)}


class KnownTokens:
    """Who each token this process has authenticated stands for (`remember`), looked up by its bearer
    secret (`principal`). It holds only what never changes about a token, so it is never stale; whether
    the token still works is for `TOKEN_LIVE` to tell, in the statement that uses the principal. At most
    `size` tokens: the oldest remembered goes first."""

    def __init__(self, size: int = 10_000) -> None:
        self._size = size
        self._known: dict[str, tuple[str, Principal]] = {}  # token id -> (secret's hash, principal)
        self._lock = threading.Lock()

    def principal(self, bearer: str) -> Principal | None:
        """The principal of a remembered token whose secret `bearer` is; None for any other."""
        parts = split_bearer(bearer)
        if parts is None:
            return None
        token_id, secret = parts
        known = self._known.get(token_id)
        if known is None or not hmac.compare_digest(known[0], secret_hash(secret)):
            return None
        return known[1]

    def remember(self, bearer: str, principal: Principal) -> None:
        """Remember `principal` as the one `bearer` stands for: `tokens.authenticate` found it so."""
        parts = split_bearer(bearer)
        if parts is None or parts[0] != principal.token_id:
            raise ValueError("remember a bearer with the principal authenticate found for it")
        with self._lock:
            self._known.pop(principal.token_id, None)
            while len(self._known) >= self._size:
                del self._known[next(iter(self._known))]
            self._known[principal.token_id] = (secret_hash(parts[1]), principal)

    def forget(self, bearer: str) -> None:
        """Drop the token whose secret `bearer` is (it no longer authenticates), if remembered. Another
        secret with a remembered token's id drops nothing."""
        remembered = self.principal(bearer)
        if remembered is not None:
            with self._lock:
                self._known.pop(remembered.token_id, None)

    def __len__(self) -> int:
        return len(self._known)
