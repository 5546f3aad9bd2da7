"""Dashboard sessions: made by signing in with an API token, ended by signing out, by their lifetimes,
or by their token's revocation or expiry.

- A session's id is 256 random bits (`new_session_id`), handed to the browser once (the dashboard's
  cookie) and stored only as its SHA-256 (`UiSessionRow.id_hash`, the primary key), as tokens' secrets
  are: a copy of the database holds no working session.
- A session works while all of these hold, checked by `session_principal` in one statement (the
  session row by its primary key, joined to its token and the token's team):
  - its row exists (signing out deletes it, `end_session`; revoking the token deletes its sessions,
    `tokens.revoke_token`);
  - it is younger than its absolute lifetime (`expires_at`, fixed at sign-in);
  - it was seen within the idle lifetime (`last_seen_at`, which page requests move forward);
  - its token is neither revoked nor expired, and is not a job's token.
- `last_seen_at` is written at most once a `TOUCH_S` (or half the idle lifetime, if shorter), not on
  every request: a page costs one indexed read, and now and then one write.
- Ended sessions are deleted whenever someone signs in (`create_session`), so the table holds the live
  ones and those that ended since the last sign-in.
"""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Select, bindparam, delete, or_, select, update
from sqlalchemy.orm import Session

from service.store.models import ApiToken, Team, UiSessionRow, as_utc, utcnow
from service.store.tokens import Principal, secret_hash
from service.store.vocab import Role

#: The longest `last_seen_at` may lag behind the last request (bounded by half the idle lifetime).
TOUCH_S = 60.0
#: The longest id a cookie may carry to be looked up at all (`new_session_id` makes 43 characters).
MAX_ID_CHARS = 100


def new_session_id() -> str:
    """A fresh session id: 32 random bytes, URL-safe base64 (a cookie value as it is)."""
    return secrets.token_urlsafe(32)


def session_hash(session_id: str) -> str:
    """What is stored of a session id: its SHA-256, in hex (as a token's secret, `tokens.secret_hash`)."""
    return secret_hash(session_id)


def _lookup_query() -> Select[Any]:
    rows, tokens, teams = UiSessionRow.__table__, ApiToken.__table__, Team.__table__
    return (select(rows.c.last_seen_at, rows.c.expires_at, tokens.c.id, tokens.c.role, tokens.c.team_id,
                   tokens.c.expires_at.label("token_expires_at"), tokens.c.revoked_at, teams.c.name)
            .select_from(rows.join(tokens, tokens.c.id == rows.c.token_id)
                         .outerjoin(teams, teams.c.id == tokens.c.team_id))
            .where(rows.c.id_hash == bindparam("id_hash")))


#: Built once: every dashboard request runs it.
_LOOKUP = _lookup_query()


def _touch_after(idle_s: float) -> timedelta:
    return timedelta(seconds=min(TOUCH_S, idle_s / 2))


def session_principal(conn: Session | Connection, session_id: str, *, idle_s: float, touch: bool = True,
                      now: datetime | None = None) -> Principal | None:
    """The principal of the session `session_id` (its token's, as `tokens.authenticate` makes it), or None
    when there is no such session or it has ended (see the module's rules; `idle_s` is the idle lifetime).
    `touch` moves the session's `last_seen_at` to now when it is older than `TOUCH_S` (a person's
    request); False leaves it (a live stream's poll, which is not the person acting). One read by
    primary key, and with `touch` now and then one update."""
    if not session_id or len(session_id) > MAX_ID_CHARS:
        return None
    connection = conn.connection() if isinstance(conn, Session) else conn
    id_hash = session_hash(session_id)
    found = connection.execute(_LOOKUP, {"id_hash": id_hash}).first()
    if found is None:
        return None
    now = now or utcnow()
    last_seen = as_utc(found.last_seen_at)
    if as_utc(found.expires_at) <= now or last_seen + timedelta(seconds=idle_s) <= now:
        return None
    if found.revoked_at is not None or found.role == Role.JOB:
        return None
    if found.token_expires_at is not None and as_utc(found.token_expires_at) <= now:
        return None
    if touch and now - last_seen >= _touch_after(idle_s):
        connection.execute(update(UiSessionRow).where(UiSessionRow.id_hash == id_hash).values(last_seen_at=now))
    return Principal(token_id=found.id, role=found.role, team_id=found.team_id, team_name=found.name)


def create_session(session: Session, token_id: str, *, idle_s: float, max_s: float,
                   now: datetime | None = None) -> str:
    """Start a session of the token `token_id`, which the caller has just authenticated, ending
    `max_s` from now at the latest; first delete every session that has ended by its lifetimes (any
    token's). Returns the session's id: the only copy, for the cookie."""
    now = now or utcnow()
    purge_ended(session, idle_s=idle_s, now=now)
    session_id = new_session_id()
    session.add(UiSessionRow(id_hash=session_hash(session_id), token_id=token_id, created_at=now,
                             last_seen_at=now, expires_at=now + timedelta(seconds=max_s)))
    session.flush()
    return session_id


def end_session(session: Session, session_id: str) -> None:
    """Sign out: delete the session `session_id` (nothing if there is none). Its cookie, wherever a copy
    of it is, stops working with this transaction's commit."""
    session.execute(delete(UiSessionRow).where(UiSessionRow.id_hash == session_hash(session_id)),
                    execution_options={"synchronize_session": False})


def purge_ended(session: Session, *, idle_s: float, now: datetime | None = None) -> None:
    """Delete the sessions past their absolute lifetime, or idle for `idle_s` or longer."""
    now = now or utcnow()
    ended = or_(UiSessionRow.expires_at <= now, UiSessionRow.last_seen_at <= now - timedelta(seconds=idle_s))
    session.execute(delete(UiSessionRow).where(ended), execution_options={"synchronize_session": False})
