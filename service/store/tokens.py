"""Teams and API tokens: creation, verification, revocation. Secrets are shown once, stored hashed."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Select, bindparam, delete, or_, select
from sqlalchemy.orm import Session

from service.store.db import upsert_into
from service.store.models import ApiToken, Job, Team, UiSessionRow, as_utc, utcnow
from service.store.vocab import Role

TOKEN_PREFIX = "shc"


class NotFound(LookupError):
    """A referenced row does not exist (or is not visible to the caller)."""


class Conflict(ValueError):
    """The request contradicts what is stored (an existing name, a reused idempotency key...)."""


class LastAdmin(Conflict):
    """Revoking this token would leave no live admin token: nobody could administer the service."""


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the token's id, role, team (members) and job (job tokens)."""

    token_id: str
    role: Role
    team_id: int | None = None
    team_name: str | None = None
    job_id: int | None = None

    @property
    def actor(self) -> str:
        return f"{self.role.value}:{self.token_id}"


def split_bearer(bearer: str) -> tuple[str, str] | None:
    """(token id, secret) of a bearer `shc_<id>_<secret>`; None for anything else."""
    parts = bearer.split("_", 2)
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX:
        return None
    return parts[1], parts[2]


def secret_hash(secret: str) -> str:
    """What is stored of a token's secret (the part after its id): its SHA-256, in hex."""
    return hashlib.sha256(secret.encode()).hexdigest()


def create_team(session: Session, name: str) -> Team:
    if session.scalar(select(Team).where(Team.name == name)) is not None:
        raise Conflict(f"team {name!r} already exists")
    team = Team(name=name)
    session.add(team)
    session.flush()
    return team


def team_by_name(session: Session, name: str) -> Team:
    team = session.scalar(select(Team).where(Team.name == name))
    if team is None:
        raise no_such_team(name)
    return team


def no_such_team(name: str) -> NotFound:
    """The `NotFound` of a team that does not exist, with the fix: teams are created on purpose."""
    return NotFound(f"no team named {name!r}; create it with POST /v1/teams")


def ensure_team(session: Session, name: str) -> Team:
    """The team `name`, created if it does not exist yet. Safe when concurrent requests race to create
    it: `INSERT ... ON CONFLICT DO NOTHING` (PostgreSQL waits for a racing insert to commit or roll
    back), then the row is read, whoever inserted it."""
    team = session.scalar(select(Team).where(Team.name == name))
    if team is not None:
        return team
    session.execute(upsert_into(session, Team).values(name=name, created_at=utcnow())
                    .on_conflict_do_nothing(index_elements=[Team.name]))
    return session.scalars(select(Team).where(Team.name == name)).one()


def create_token(session: Session, *, role: Role, team: Team | None = None, job_id: int | None = None,
                 name: str | None = None, expires_at: datetime | None = None) -> tuple[ApiToken, str]:
    """Create a token; return the row and the full secret `shc_<id>_<secret>` (never stored)."""
    if role == Role.MEMBER and team is None:
        raise ValueError("a member token needs a team")
    if role == Role.JOB and job_id is None:
        raise ValueError("a job token needs a job")
    token_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    row = ApiToken(id=token_id, secret_hash=secret_hash(secret), role=role, team_id=team.id if team else None,
                   job_id=job_id, name=name, expires_at=expires_at)
    session.add(row)
    session.flush()
    return row, f"{TOKEN_PREFIX}_{token_id}_{secret}"


#: How long a job's token keeps working after its job ends (time for the final report).
DEFAULT_JOB_TOKEN_GRACE_S = 300.0


def _authentication_query() -> Select[Any]:
    tokens, teams, jobs = ApiToken.__table__, Team.__table__, Job.__table__
    return (select(tokens.c.id, tokens.c.secret_hash, tokens.c.role, tokens.c.team_id, tokens.c.job_id,
                   tokens.c.expires_at, tokens.c.revoked_at, teams.c.name, jobs.c.finished_at)
            .select_from(tokens.outerjoin(teams, teams.c.id == tokens.c.team_id)
                         .outerjoin(jobs, jobs.c.id == tokens.c.job_id))
            .where(tokens.c.id == bindparam("token_id")))


#: Built once: every request with a token runs it, a job's heartbeats included.
_AUTHENTICATION = _authentication_query()


def authenticate(session: Session | Connection, bearer: str, *,
                 job_token_grace_s: float = DEFAULT_JOB_TOKEN_GRACE_S) -> Principal | None:
    """The principal behind a bearer secret, or None if it is unknown, revoked or expired. A job
    token also ends `job_token_grace_s` after its job has: derived from the job's `finished_at`, so
    however the job ended (dispatcher, API cancel) nothing has to write an expiry. One query: the
    token's columns with its team's name and its job's `finished_at`. `session` may be a Core
    connection (the request gate's: no ORM session for one read)."""
    parts = split_bearer(bearer)
    if parts is None:
        return None
    token_id, secret = parts
    conn = session.connection() if isinstance(session, Session) else session
    found = conn.execute(_AUTHENTICATION, {"token_id": token_id}).first()
    if found is None or not hmac.compare_digest(found.secret_hash, secret_hash(secret)):
        return None
    now = utcnow()
    if found.revoked_at is not None:
        return None
    if found.expires_at is not None and as_utc(found.expires_at) <= now:
        return None
    if found.role == Role.JOB and found.finished_at is not None \
            and as_utc(found.finished_at) + timedelta(seconds=job_token_grace_s) <= now:
        return None
    return Principal(token_id=found.id, role=found.role, team_id=found.team_id, team_name=found.name,
                     job_id=found.job_id)


MIN_ID_PREFIX = 4  # shorter prefixes are too easy to mistype into someone else's token
MAX_CANDIDATES = 10


def token_by_id(session: Session, token_id: str) -> ApiToken:
    """The token whose id is `token_id`, or else the one token whose id starts with it (at least
    `MIN_ID_PREFIX` characters; `shardctl token list` may show ids cut short).

    Raises `NotFound` when no id matches and `Conflict`, naming the candidates, when several do.
    """
    row = session.get(ApiToken, token_id)
    if row is not None:
        return row
    if len(token_id) < MIN_ID_PREFIX:
        raise NotFound(f"no token {token_id!r} (a shortened id needs at least {MIN_ID_PREFIX} characters)")
    rows = list(session.scalars(select(ApiToken).where(ApiToken.id.startswith(token_id, autoescape=True))
                                .order_by(ApiToken.id).limit(MAX_CANDIDATES + 1)))
    if not rows:
        raise NotFound(f"no token {token_id!r}")
    if len(rows) > 1:
        named = ", ".join(f"{r.id} ({r.role}{' ' + repr(r.name) if r.name else ''})" for r in rows[:MAX_CANDIDATES])
        more = " and more" if len(rows) > MAX_CANDIDATES else ""
        raise Conflict(f"token id prefix {token_id!r} is ambiguous: it matches {named}{more}; give more characters")
    return rows[0]


def revoke_token(session: Session, token_id: str) -> ApiToken:
    """Revoke the token `token_id` names (its id or a unique prefix of it, see `token_by_id`) and delete
    the dashboard sessions made with it (`service.store.ui_sessions`); idempotent. Raises `LastAdmin`
    rather than revoke the last live admin token."""
    row = token_by_id(session, token_id)
    if row.revoked_at is None:
        if row.role == Role.ADMIN:
            ensure_not_last_admin(session, row)
        row.revoked_at = utcnow()
    session.execute(delete(UiSessionRow).where(UiSessionRow.token_id == row.id),
                    execution_options={"synchronize_session": False})
    return row


def list_tokens(session: Session) -> list[ApiToken]:
    return list(session.scalars(select(ApiToken).where(ApiToken.role != Role.JOB).order_by(ApiToken.created_at)))


def _live_admins(session: Session, *, lock: bool = False) -> list[str]:
    """Ids of the admin tokens that work now (neither revoked nor expired). `lock` takes them
    `FOR UPDATE` (PostgreSQL; SQLite's `BEGIN IMMEDIATE` already serialises writers), so that two
    admins revoking each other's tokens at once cannot both succeed."""
    stmt = select(ApiToken.id).where(ApiToken.role == Role.ADMIN, ApiToken.revoked_at.is_(None),
                                     or_(ApiToken.expires_at.is_(None), ApiToken.expires_at > utcnow()))
    return list(session.scalars(stmt.with_for_update() if lock else stmt))


def ensure_not_last_admin(session: Session, row: ApiToken) -> None:
    """Raise `LastAdmin` when `row` is the only live admin token."""
    live = _live_admins(session, lock=True)
    if live == [row.id]:
        raise LastAdmin(f"token {row.id} is the last live admin token: revoking it would lock every admin out;"
                        " create another admin token first (shardctl token create --role admin), then revoke"
                        " this one")


def has_admin(session: Session) -> bool:
    """True while some admin token works (neither revoked nor expired)."""
    return bool(_live_admins(session))
