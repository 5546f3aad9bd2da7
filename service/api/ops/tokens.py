"""API tokens: mint, list and revoke them (admins only), as `POST /v1/tokens`, `GET /v1/tokens` and
`POST /v1/tokens/{id}/revoke` answer and the dashboard's Admin page does. A token's secret is in
`issue_token`'s answer only; the store keeps its hash."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy.orm import Session, sessionmaker

from service.api.errors import ApiError
from service.api.ops.access import admin_only
from service.api.schemas import ErrorField, TokenCreated, TokenIn, TokenOut
from service.api.views import token_out
from service.store.models import Job, utcnow
from service.store.tokens import LastAdmin, Principal, create_token, list_tokens, revoke_token, team_by_name
from service.store.vocab import Role


def issue_token(db: sessionmaker[Session], principal: Principal, body: TokenIn) -> TokenCreated:
    """Mint a token as `body` asks (admins only: a 403 otherwise). A member token needs a team that
    exists (`NotFound` otherwise), a job token an existing job: a 422 naming the field when missing."""
    admin_only(principal)
    expires = utcnow() + timedelta(seconds=body.expires_in_s) if body.expires_in_s else None
    with db.begin() as session:
        team = None
        if body.role == Role.MEMBER:
            if not body.team:
                raise ApiError(422, "validation_error", "a member token needs a team",
                               fields=[ErrorField(loc="team", message="required for role member")])
            team = team_by_name(session, body.team)
        if body.role == Role.JOB and (body.job_id is None or session.get(Job, body.job_id) is None):
            raise ApiError(422, "validation_error", "a job token needs the id of an existing job",
                           fields=[ErrorField(loc="job_id", message="required for role job")])
        row, secret = create_token(session, role=body.role, team=team, job_id=body.job_id, name=body.name,
                                   expires_at=expires)
        session.refresh(row)
        return TokenCreated(**token_out(row).model_dump(), token=secret)


def token_list(db: sessionmaker[Session], principal: Principal) -> list[TokenOut]:
    """Admin and member tokens, without secrets (admins only: a 403 otherwise)."""
    admin_only(principal)
    with db.begin() as session:
        return [token_out(t) for t in list_tokens(session)]


def revoke(db: sessionmaker[Session], principal: Principal, token_id: str) -> TokenOut:
    """Revoke a token (idempotent; admins only: a 403 otherwise). `token_id` is its id or a unique
    prefix of it (4 characters at least): `NotFound` for none, `Conflict` naming them for a prefix
    that matches several. Revoking the last live admin token is a 409 `last_admin`."""
    admin_only(principal)
    try:
        with db.begin() as session:
            return token_out(revoke_token(session, token_id))
    except LastAdmin as exc:
        raise ApiError(409, "last_admin", str(exc)) from exc
