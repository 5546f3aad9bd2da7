from __future__ import annotations

from datetime import timedelta

from fastapi import APIRouter

from service.api.deps import Admin, Caller, Db
from service.api.errors import ApiError
from service.api.schemas import ErrorField, ErrorResponse, TokenCreated, TokenIn, TokenOut, WhoAmI
from service.api.views import token_out
from service.store.models import Job, utcnow
from service.store.tokens import LastAdmin, create_token, list_tokens, revoke_token, team_by_name
from service.store.vocab import Role

router = APIRouter(tags=["tokens"])


@router.post("/v1/tokens", response_model=TokenCreated, status_code=201,
             responses={404: {"model": ErrorResponse}, 422: {"model": ErrorResponse}})
def post_token(body: TokenIn, _: Admin, db: Db) -> TokenCreated:
    """Mint a token. The secret is in the response only; store it now."""
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


@router.get("/v1/tokens", response_model=list[TokenOut], summary="Admin and member tokens (no secrets)")
def get_tokens(_: Admin, db: Db) -> list[TokenOut]:
    with db.begin() as session:
        return [token_out(t) for t in list_tokens(session)]


@router.post("/v1/tokens/{token_id}/revoke", response_model=TokenOut,
             responses={404: {"model": ErrorResponse}, 409: {"model": ErrorResponse}})
def revoke(token_id: str, _: Admin, db: Db) -> TokenOut:
    """Revoke a token (idempotent). `token_id` is its id or a unique prefix of it (4 characters at least);
    a prefix that matches several tokens is a 409 naming them. Revoking the last live admin token is a
    409 (`last_admin`): create another admin token first."""
    try:
        with db.begin() as session:
            return token_out(revoke_token(session, token_id))
    except LastAdmin as exc:
        raise ApiError(409, "last_admin", str(exc)) from exc


@router.get("/v1/whoami", response_model=WhoAmI)
def whoami(principal: Caller) -> WhoAmI:
    return WhoAmI(token_id=principal.token_id, role=principal.role, team=principal.team_name,
                  job_id=principal.job_id)
