"""Tokens: `POST /v1/tokens`, `GET /v1/tokens`, `POST /v1/tokens/{id}/revoke` (admins), and
`GET /v1/whoami`. The routes read the request and call the service layer (`service.api.ops.tokens`)."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import Admin, Caller, Db
from service.api.ops.tokens import issue_token, token_list
from service.api.ops.tokens import revoke as revoke_token
from service.api.schemas import ErrorResponse, TokenCreated, TokenIn, TokenOut, WhoAmI

router = APIRouter(tags=["tokens"])


@router.post("/v1/tokens", response_model=TokenCreated, status_code=201,
             responses={404: {"model": ErrorResponse}, 422: {"model": ErrorResponse}})
def post_token(body: TokenIn, principal: Admin, db: Db) -> TokenCreated:
    """Mint a token. The secret is in the response only; store it now."""
    return issue_token(db, principal, body)


@router.get("/v1/tokens", response_model=list[TokenOut], summary="Admin and member tokens (no secrets)")
def get_tokens(principal: Admin, db: Db) -> list[TokenOut]:
    return token_list(db, principal)


@router.post("/v1/tokens/{token_id}/revoke", response_model=TokenOut,
             responses={404: {"model": ErrorResponse}, 409: {"model": ErrorResponse}})
def revoke(token_id: str, principal: Admin, db: Db) -> TokenOut:
    """Revoke a token (idempotent). `token_id` is its id or a unique prefix of it (4 characters at least);
    a prefix that matches several tokens is a 409 naming them. Revoking the last live admin token is a
    409 (`last_admin`): create another admin token first."""
    return revoke_token(db, principal, token_id)


@router.get("/v1/whoami", response_model=WhoAmI)
def whoami(principal: Caller) -> WhoAmI:
    return WhoAmI(token_id=principal.token_id, role=principal.role, team=principal.team_name,
                  job_id=principal.job_id)
