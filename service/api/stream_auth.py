"""Who a live stream acts for, checked again on every poll: a stream outlives the request that opened it.

- A shardctl bearer token is authenticated again in each poll's transaction: a token revoked or
  expired meanwhile ends the stream (`unauthorized`).
- A user an authenticating proxy named (`service.api.forwarded`, principal id `user:<name>`) acts as
  resolved when the stream opened: the proxy vouched for that request, and there is no token to
  revoke (the proxy ends sessions; a reconnect goes through it again). Visibility is still checked
  on every poll by the caller (`visible_job`, the feed's scope), so a job or team out of reach ends
  the stream as it does for a token.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi.security import HTTPAuthorizationCredentials
from sqlalchemy.orm import Session

from service.api.forwarded import ID_PREFIX
from service.store.tokens import Principal, authenticate

#: In one poll's transaction: who the stream acts for now, or None when it must end (unauthorized).
StreamAuth = Callable[[Session], Principal | None]


def bearer_again(secret: str, token_grace_s: float) -> StreamAuth:
    """The token `secret`, authenticated again on every poll."""
    def check(session: Session) -> Principal | None:
        return authenticate(session, secret, job_token_grace_s=token_grace_s)
    return check


def for_stream(principal: Principal, credentials: HTTPAuthorizationCredentials | None,
               token_grace_s: float) -> StreamAuth:
    """How a stream opened by `principal` (with `credentials`, if a bearer token came) checks its caller."""
    if principal.token_id.startswith(ID_PREFIX):
        return lambda session: principal
    if credentials is None:  # `Caller` let it through: it authenticated somehow, but with nothing to check again
        raise ValueError("a stream opened without a forwarded identity needs its bearer token")
    return bearer_again(credentials.credentials, token_grace_s)


def as_stream_auth(auth: StreamAuth | str, token_grace_s: float) -> StreamAuth:
    """`auth`, or a bearer secret as one (the dashboard passes its session's check, `ui.session.stream_auth`)."""
    return bearer_again(auth, token_grace_s) if isinstance(auth, str) else auth


__all__ = ["StreamAuth", "as_stream_auth", "bearer_again", "for_stream"]
